//! [`LogIo`] on io_uring: glommio `DmaFile` (O_DIRECT), preallocated with fallocate.
//!
//! Must run inside a glommio executor. Listing the directory and fsyncing it after a segment
//! is created or removed are plain syscalls (rare: start-up and segment rolls).

use std::cell::RefCell;
use std::collections::HashMap;
use std::io;
use std::path::PathBuf;
use std::rc::Rc;

use glommio::io::{BufferedFile, DmaFile, OpenOptions};

use super::io::LogIo;

/// Log files in one directory.
pub struct DmaLogIo {
    dir: PathBuf,
    files: RefCell<HashMap<String, Rc<DmaFile>>>,
    readers: RefCell<HashMap<String, Rc<BufferedFile>>>,
}

fn to_io(e: glommio::GlommioError<()>) -> io::Error {
    io::Error::other(e.to_string())
}

impl DmaLogIo {
    /// Log files under `dir` (created if missing).
    ///
    /// # Errors
    /// The directory cannot be created.
    pub fn new(dir: impl Into<PathBuf>) -> io::Result<Self> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir)?;
        Ok(DmaLogIo {
            dir,
            files: RefCell::default(),
            readers: RefCell::default(),
        })
    }

    async fn file(&self, name: &str) -> io::Result<Rc<DmaFile>> {
        if let Some(f) = self.files.borrow().get(name) {
            return Ok(Rc::clone(f));
        }
        let f = Rc::new(
            OpenOptions::new()
                .read(true)
                .write(true)
                .dma_open(self.dir.join(name))
                .await
                .map_err(to_io)?,
        );
        self.files
            .borrow_mut()
            .insert(name.to_owned(), Rc::clone(&f));
        Ok(f)
    }

    async fn reader(&self, name: &str) -> io::Result<Rc<BufferedFile>> {
        if let Some(f) = self.readers.borrow().get(name) {
            return Ok(Rc::clone(f));
        }
        let f = Rc::new(
            BufferedFile::open(self.dir.join(name))
                .await
                .map_err(to_io)?,
        );
        self.readers
            .borrow_mut()
            .insert(name.to_owned(), Rc::clone(&f));
        Ok(f)
    }

    fn sync_dir(&self) -> io::Result<()> {
        std::fs::File::open(&self.dir)?.sync_all()
    }
}

impl LogIo for DmaLogIo {
    async fn list(&self) -> io::Result<Vec<String>> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(&self.dir)? {
            if let Some(n) = e?.file_name().to_str() {
                out.push(n.to_owned());
            }
        }
        Ok(out)
    }

    async fn open(&self, name: &str, len: u64) -> io::Result<()> {
        if self.files.borrow().contains_key(name) {
            return Ok(());
        }
        let path = self.dir.join(name);
        if !path.exists() {
            let f = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .dma_open(&path)
                .await
                .map_err(to_io)?;
            f.pre_allocate(len, false).await.map_err(to_io)?;
            f.fdatasync().await.map_err(to_io)?;
            f.close().await.map_err(to_io)?;
            self.sync_dir()?;
        }
        let f = self.file(name).await?;
        if f.file_size().await.map_err(to_io)? < len {
            f.pre_allocate(len, false).await.map_err(to_io)?;
        }
        Ok(())
    }

    async fn remove(&self, name: &str) -> io::Result<()> {
        self.files.borrow_mut().remove(name);
        self.readers.borrow_mut().remove(name);
        std::fs::remove_file(self.dir.join(name))?;
        self.sync_dir()
    }

    async fn read_at(&self, name: &str, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        let size = self.file(name).await?.file_size().await.map_err(to_io)?;
        let len = len.min(usize::try_from(size.saturating_sub(offset)).unwrap_or(usize::MAX));
        if len == 0 {
            return Ok(Vec::new());
        }
        // Reads go through a buffered (page cache) descriptor: O_DIRECT reads of a file this
        // executor wrote failed with EOPNOTSUPP here. Direct writes invalidate the cached
        // pages, so these reads always see the written data.
        let reader = self.reader(name).await?;
        let r = reader.read_at(offset, len).await.map_err(to_io)?;
        Ok(r.to_vec())
    }

    async fn write_at(&self, name: &str, offset: u64, data: Vec<u8>) -> io::Result<()> {
        let f = self.file(name).await?;
        let mut buf = f.alloc_dma_buffer(data.len());
        buf.as_bytes_mut().copy_from_slice(&data);
        let n = f.write_at(buf, offset).await.map_err(to_io)?;
        if n != data.len() {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!("short write: {n} of {}", data.len()),
            ));
        }
        Ok(())
    }

    async fn sync(&self, name: &str) -> io::Result<()> {
        self.file(name).await?.fdatasync().await.map_err(to_io)
    }

    async fn len(&self, name: &str) -> io::Result<u64> {
        self.file(name).await?.file_size().await.map_err(to_io)
    }
}
