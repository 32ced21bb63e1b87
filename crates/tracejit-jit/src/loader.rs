//! Maps a checked [`CodeImage`] into executable memory: a fresh private
//! mapping, written while it is read-write (the code, then the constant
//! table after it, 64-byte aligned), each relocation patched with this
//! process's address of its symbol, then made read-execute (never writable
//! and executable at once). The mapping lives as long as its
//! [`LoadedCode`]; it is unmapped on drop.
//!
//! x86-64 needs no instruction-cache maintenance after writing code; other
//! architectures would, so the loader refuses to run there.

use crate::code_image::{CodeImage, Symbols, KERNEL_CONSTS};

/// Code mapped for execution.
pub(crate) struct LoadedCode {
    base: *mut u8,
    len: usize,
}

// SAFETY: the mapping is immutable (read-execute) once `load` returns and
// is only unmapped by `drop`, which has exclusive access.
unsafe impl Send for LoadedCode {}
// SAFETY: see `Send`.
unsafe impl Sync for LoadedCode {}

impl LoadedCode {
    /// The entry of the function (offset 0 of the image's code).
    pub fn entry(&self) -> *const u8 {
        self.base
    }
}

impl Drop for LoadedCode {
    fn drop(&mut self) {
        #[cfg(unix)]
        // SAFETY: `base`/`len` are the mapping `load` made; nothing points
        // into it once its owner is dropped.
        unsafe {
            libc::munmap(self.base.cast(), self.len);
        }
    }
}

/// Where the constant table starts in the mapping.
fn consts_offset(image: &CodeImage) -> usize {
    image.code.len().div_ceil(64) * 64
}

/// Checks `image` ([`CodeImage::check`]) and maps it for execution.
pub(crate) fn load(image: &CodeImage) -> Result<LoadedCode, String> {
    image.check()?;
    map(image)
}

#[cfg(all(unix, target_arch = "x86_64"))]
fn map(image: &CodeImage) -> Result<LoadedCode, String> {
    let symbols = Symbols::get();
    let table_at = consts_offset(image);
    let used = table_at + 16 * image.consts.len();
    // SAFETY: `sysconf` has no preconditions.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096).max(4096);
    let len = used.div_ceil(page) * page;
    // SAFETY: a fresh anonymous private mapping; no existing memory is touched.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(format!("mmap of {len} bytes for code failed: {}", std::io::Error::last_os_error()));
    }
    let code = LoadedCode { base: base.cast(), len };
    // SAFETY: the mapping is `len >= used` bytes, writable, and ours alone;
    // `check` bounded every relocation inside the code, and the table
    // starts past the code.
    unsafe {
        std::ptr::copy_nonoverlapping(image.code.as_ptr(), code.base, image.code.len());
        for (k, c) in image.consts.iter().enumerate() {
            std::ptr::write_unaligned(code.base.add(table_at + 16 * k).cast::<[u8; 16]>(), c.to_le_bytes());
        }
        for r in &image.relocs {
            let address = if r.symbol == KERNEL_CONSTS {
                code.base as usize + table_at
            } else {
                symbols.address(&r.symbol).ok_or_else(|| format!("unknown symbol `{}`", r.symbol))?
            };
            std::ptr::write_unaligned(code.base.add(r.offset as usize).cast::<u64>(), address as u64);
        }
    }
    // SAFETY: the same mapping, now complete: read and execute only.
    if unsafe { libc::mprotect(base, len, libc::PROT_READ | libc::PROT_EXEC) } != 0 {
        return Err(format!("mprotect of code failed: {}", std::io::Error::last_os_error()));
    }
    Ok(code)
}

#[cfg(not(all(unix, target_arch = "x86_64")))]
fn map(_image: &CodeImage) -> Result<LoadedCode, String> {
    Err("tracejit's code loader supports x86-64 Unix only".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::code_image::CodeReloc;

    /// `movabs rax, <consts>; mov rax, [rax]; ret`: a function that returns
    /// the low 8 bytes of its first constant, through a patched relocation.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn a_loaded_function_reads_its_patched_constant_table() {
        let mut code = vec![0x48, 0xb8];
        code.extend_from_slice(&[0; 8]);
        code.extend_from_slice(&[0x48, 0x8b, 0x00, 0xc3]);
        let image = CodeImage {
            code,
            align: 16,
            consts: vec![0x1234_5678_9abc_def0],
            relocs: vec![CodeReloc { offset: 2, symbol: KERNEL_CONSTS.into() }],
        };
        let loaded = load(&image).unwrap();
        // SAFETY: the bytes above are a complete function of this signature.
        let f: extern "C" fn() -> u64 = unsafe { std::mem::transmute(loaded.entry()) };
        assert_eq!(f(), 0x1234_5678_9abc_def0);
    }

    #[test]
    fn an_unknown_symbol_is_never_mapped() {
        let image = CodeImage {
            code: vec![0xc3; 16],
            align: 16,
            consts: vec![],
            relocs: vec![CodeReloc { offset: 0, symbol: "abort".into() }],
        };
        assert!(load(&image).err().unwrap().contains("unknown symbol `abort`"));
    }
}
