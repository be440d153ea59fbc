//! A minimal HTTP/1.1 server for `/metrics` and `/healthz`: one request per connection,
//! bounded request size, `Connection: close`.

use std::rc::Rc;
use std::time::Duration;

use futures_lite::{future, AsyncReadExt, AsyncWriteExt};
use glommio::net::{TcpListener, TcpStream};

use crate::shutdown::Shutdown;

/// Largest request head accepted.
pub const REQUEST_HEAD_MAX: usize = 8 << 10;
/// How long a client may take to send its request.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// A response: status code, content type, body.
pub struct HttpResponse {
    /// Status code.
    pub status: u16,
    /// `Content-Type`.
    pub content_type: &'static str,
    /// Body.
    pub body: String,
}

/// Answers a GET for a path.
pub type HttpHandler = Rc<dyn Fn(&str) -> HttpResponse>;

async fn read_head(stream: &mut TcpStream) -> Option<String> {
    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    loop {
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.windows(4).any(|w| w == b"\r\n\r\n") {
            return String::from_utf8(buf).ok();
        }
        if buf.len() > REQUEST_HEAD_MAX {
            return None;
        }
    }
}

async fn serve_one(mut stream: TcpStream, handler: HttpHandler) {
    let head = future::or(read_head(&mut stream), async {
        glommio::timer::sleep(REQUEST_TIMEOUT).await;
        None
    })
    .await;
    let Some(head) = head else { return };
    let mut parts = head.lines().next().unwrap_or_default().split(' ');
    let (method, path) = (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
    );
    let resp = if method == "GET" || method == "HEAD" {
        handler(path.split('?').next().unwrap_or_default())
    } else {
        HttpResponse {
            status: 405,
            content_type: "text/plain",
            body: "method not allowed\n".into(),
        }
    };
    let reason = match resp.status {
        200 => "OK",
        404 => "Not Found",
        405 => "Method Not Allowed",
        503 => "Service Unavailable",
        _ => "Error",
    };
    let body = if method == "HEAD" {
        ""
    } else {
        resp.body.as_str()
    };
    let out = format!(
        "HTTP/1.1 {} {reason}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        resp.status,
        resp.content_type,
        resp.body.len(),
    );
    let _ = stream.write_all(out.as_bytes()).await;
    let _ = stream.close().await;
}

/// Serves HTTP on `listener` until `shutdown`.
pub async fn serve(listener: TcpListener, handler: HttpHandler, shutdown: Shutdown) {
    crate::listener::accept_until(&listener, &shutdown, "net.http", |s| {
        glommio::spawn_local(serve_one(s, Rc::clone(&handler))).detach();
    })
    .await;
}
