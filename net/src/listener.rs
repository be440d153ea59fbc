//! The accept loop shared by the gRPC and HTTP servers.

use std::time::Duration;

use futures_lite::future;
use glommio::net::{TcpListener, TcpStream};

use crate::shutdown::Shutdown;

/// Pause after a failed accept (e.g. out of file descriptors) before trying again.
const ACCEPT_RETRY: Duration = Duration::from_millis(10);

/// Hands every accepted connection to `on_conn` until `shutdown` is triggered.
pub(crate) async fn accept_until(
    listener: &TcpListener,
    shutdown: &Shutdown,
    target: &'static str,
    mut on_conn: impl FnMut(TcpStream),
) {
    loop {
        let accepted = future::or(async { Some(listener.accept().await) }, async {
            shutdown.wait().await;
            None
        })
        .await;
        match accepted {
            None => return,
            Some(Ok(stream)) => on_conn(stream),
            Some(Err(e)) => {
                tracing::warn!(target: "net", listener = target, error = %e, "accept failed");
                glommio::timer::sleep(ACCEPT_RETRY).await;
            }
        }
    }
}
