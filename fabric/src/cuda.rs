//! CUDA device memory as a memory source (feature `cuda`).
//!
//! `libcuda.so` is loaded with `dlopen` at run time (libloading), so the crate
//! builds and runs without CUDA installed; every entry point then fails with
//! [`FabricError::Cuda`]. Used entry points: `cuInit`, `cuDeviceGet`,
//! `cuDevicePrimaryCtxRetain/Release`, `cuCtxSetCurrent`, `cuMemAlloc`,
//! `cuMemFree`, `cuMemcpyHtoD/DtoH` (the tcp backend's bounce path),
//! `cuMemGetAddressRange`, `cuPointerGetAttribute`,
//! `cuMemGetHandleForAddressRange` (a dma-buf fd for `ibv_reg_dmabuf_mr`) and
//! `cuIpcGetMemHandle/OpenMemHandle/CloseMemHandle` (memory shared between
//! processes).

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::fmt;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::OnceLock;

use crate::error::{FabricError, Result};

type CuResult = c_int;
type CuDevice = c_int;
type CuContext = *mut c_void;
type CuDevicePtr = u64;

/// `CU_POINTER_ATTRIBUTE_MEMORY_TYPE`.
const ATTR_MEMORY_TYPE: c_int = 2;
/// `CU_MEMORYTYPE_DEVICE`.
const MEMORYTYPE_DEVICE: c_uint = 2;
/// `CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD`.
const RANGE_HANDLE_DMA_BUF_FD: c_int = 1;
/// `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`.
const IPC_LAZY_PEER_ACCESS: c_uint = 1;

/// A CUDA IPC memory handle (`CUipcMemHandle`, 64 opaque bytes).
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct IpcMemHandle(pub [u8; 64]);

impl fmt::Debug for IpcMemHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("IpcMemHandle(..)")
    }
}

struct Api {
    _lib: libloading::Library,
    init: unsafe extern "C" fn(c_uint) -> CuResult,
    device_get: unsafe extern "C" fn(*mut CuDevice, c_int) -> CuResult,
    primary_ctx_retain: unsafe extern "C" fn(*mut CuContext, CuDevice) -> CuResult,
    primary_ctx_release: unsafe extern "C" fn(CuDevice) -> CuResult,
    ctx_set_current: unsafe extern "C" fn(CuContext) -> CuResult,
    mem_alloc: unsafe extern "C" fn(*mut CuDevicePtr, usize) -> CuResult,
    mem_free: unsafe extern "C" fn(CuDevicePtr) -> CuResult,
    memcpy_htod: unsafe extern "C" fn(CuDevicePtr, *const c_void, usize) -> CuResult,
    memcpy_dtoh: unsafe extern "C" fn(*mut c_void, CuDevicePtr, usize) -> CuResult,
    get_address_range: unsafe extern "C" fn(*mut CuDevicePtr, *mut usize, CuDevicePtr) -> CuResult,
    pointer_get_attribute: unsafe extern "C" fn(*mut c_void, c_int, CuDevicePtr) -> CuResult,
    get_handle_for_range:
        unsafe extern "C" fn(*mut c_void, CuDevicePtr, usize, c_int, u64) -> CuResult,
    ipc_open: unsafe extern "C" fn(*mut CuDevicePtr, IpcMemHandle, c_uint) -> CuResult,
    ipc_close: unsafe extern "C" fn(CuDevicePtr) -> CuResult,
    ipc_get: unsafe extern "C" fn(*mut IpcMemHandle, CuDevicePtr) -> CuResult,
    error_string: unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult,
}

fn load() -> std::result::Result<Api, String> {
    // SAFETY: loading the CUDA driver library runs its initialisers, which
    // is what every CUDA program does; we call nothing before cuInit.
    let lib = unsafe { libloading::Library::new("libcuda.so.1") }.or_else(|first| {
        // SAFETY: as above.
        unsafe { libloading::Library::new("libcuda.so") }.map_err(|second| {
            // Both reasons: the first is the one that matters when
            // libcuda.so.1 exists but does not load.
            format!(
                "cannot load libcuda.so.1 ({first}) nor libcuda.so ({second}); is the NVIDIA driver installed?"
            )
        })
    })?;
    macro_rules! sym {
        ($name:literal) => {
            // SAFETY: the symbol has the C signature of the CUDA driver API
            // function of that name (cuda.h), matching the field's type.
            *unsafe { lib.get($name) }
                .map_err(|e| format!("libcuda lacks {}: {e}", String::from_utf8_lossy($name)))?
        };
    }
    let api = Api {
        init: sym!(b"cuInit\0"),
        device_get: sym!(b"cuDeviceGet\0"),
        primary_ctx_retain: sym!(b"cuDevicePrimaryCtxRetain\0"),
        primary_ctx_release: sym!(b"cuDevicePrimaryCtxRelease_v2\0"),
        ctx_set_current: sym!(b"cuCtxSetCurrent\0"),
        mem_alloc: sym!(b"cuMemAlloc_v2\0"),
        mem_free: sym!(b"cuMemFree_v2\0"),
        memcpy_htod: sym!(b"cuMemcpyHtoD_v2\0"),
        memcpy_dtoh: sym!(b"cuMemcpyDtoH_v2\0"),
        get_address_range: sym!(b"cuMemGetAddressRange_v2\0"),
        pointer_get_attribute: sym!(b"cuPointerGetAttribute\0"),
        get_handle_for_range: sym!(b"cuMemGetHandleForAddressRange\0"),
        ipc_open: sym!(b"cuIpcOpenMemHandle_v2\0"),
        ipc_close: sym!(b"cuIpcCloseMemHandle\0"),
        ipc_get: sym!(b"cuIpcGetMemHandle\0"),
        error_string: sym!(b"cuGetErrorString\0"),
        _lib: lib,
    };
    // SAFETY: cuInit(0) is the documented first call.
    let rc = unsafe { (api.init)(0) };
    if rc != 0 {
        return Err(format!("cuInit: {}", describe(&api, rc)));
    }
    Ok(api)
}

fn api() -> Result<&'static Api> {
    static API: OnceLock<std::result::Result<Api, String>> = OnceLock::new();
    API.get_or_init(load)
        .as_ref()
        .map_err(|e| FabricError::Cuda(e.clone()))
}

/// The driver's text for `rc` and the number, e.g. `invalid resource
/// handle (CUDA error 400)`.
fn describe(api: &Api, rc: CuResult) -> String {
    let mut s: *const c_char = std::ptr::null();
    // SAFETY: cuGetErrorString writes a pointer to a static string or leaves NULL.
    unsafe { (api.error_string)(rc, &mut s) };
    if s.is_null() {
        format!("CUDA error {rc}")
    } else {
        // SAFETY: non-NULL results are static NUL-terminated strings.
        let text = unsafe { CStr::from_ptr(s) }.to_string_lossy();
        format!("{text} (CUDA error {rc})")
    }
}

fn check(api: &Api, rc: CuResult, what: &str) -> Result<()> {
    if rc == 0 {
        return Ok(());
    }
    Err(FabricError::Cuda(format!("{what}: {}", describe(api, rc))))
}

/// Whether the CUDA driver can be loaded and initialised here.
pub fn available() -> bool {
    api().is_ok()
}

/// Loads and initialises the CUDA driver (`libcuda.so.1`, found the way
/// `dlopen` finds libraries, so `LD_LIBRARY_PATH` picks it), once per
/// process.
///
/// # Errors
/// [`FabricError::Cuda`] saying why the driver is unavailable: the library
/// does not load, lacks an entry point, or `cuInit` failed.
pub fn init() -> Result<()> {
    api().map(|_| ())
}

enum Owner {
    Alloc,
    Ipc,
}

/// Device memory in the primary context of one GPU: allocated by us or
/// opened from another process's IPC handle. Freed / closed on drop.
pub struct DeviceMemory {
    dptr: CuDevicePtr,
    len: usize,
    device: CuDevice,
    ctx: CuContext,
    owner: Owner,
}

// SAFETY: a device pointer and a primary context may be used from any
// thread once made current there (every method does so).
unsafe impl Send for DeviceMemory {}
// SAFETY: see Send; methods take &self and the driver is thread-safe.
unsafe impl Sync for DeviceMemory {}

impl fmt::Debug for DeviceMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceMemory")
            .field("dptr", &format_args!("{:#x}", self.dptr))
            .field("len", &self.len)
            .field("device", &self.device)
            .finish()
    }
}

fn primary_ctx(api: &Api, ordinal: i32) -> Result<(CuDevice, CuContext)> {
    let mut dev: CuDevice = 0;
    // SAFETY: out-pointer is valid.
    let rc = unsafe { (api.device_get)(&mut dev, ordinal) };
    check(api, rc, "cuDeviceGet")?;
    let mut ctx: CuContext = std::ptr::null_mut();
    // SAFETY: out-pointer is valid; `dev` came from cuDeviceGet.
    let rc = unsafe { (api.primary_ctx_retain)(&mut ctx, dev) };
    check(api, rc, "cuDevicePrimaryCtxRetain")?;
    Ok((dev, ctx))
}

impl DeviceMemory {
    /// Allocates `len` bytes on GPU `ordinal`.
    pub fn alloc(ordinal: i32, len: usize) -> Result<DeviceMemory> {
        let api = api()?;
        let (device, ctx) = primary_ctx(api, ordinal)?;
        let mut dm = DeviceMemory {
            dptr: 0,
            len,
            device,
            ctx,
            owner: Owner::Alloc,
        };
        dm.make_current()?;
        // SAFETY: out-pointer valid; a context is current.
        let rc = unsafe { (api.mem_alloc)(&mut dm.dptr, len.max(1)) };
        check(api, rc, "cuMemAlloc")?;
        Ok(dm)
    }

    /// Opens device memory that another process exported with
    /// `cuIpcGetMemHandle` (the host-shim's path for tenant GPU buffers).
    pub fn open_ipc(ordinal: i32, handle: IpcMemHandle, len: usize) -> Result<DeviceMemory> {
        let api = api()?;
        let (device, ctx) = primary_ctx(api, ordinal)?;
        let mut dm = DeviceMemory {
            dptr: 0,
            len,
            device,
            ctx,
            owner: Owner::Ipc,
        };
        dm.make_current()?;
        // SAFETY: out-pointer valid; `handle` is passed by value as the API requires.
        let rc = unsafe { (api.ipc_open)(&mut dm.dptr, handle, IPC_LAZY_PEER_ACCESS) };
        check(api, rc, "cuIpcOpenMemHandle")?;
        let (_, size) = dm.address_range()?;
        if size < len as u64 {
            return Err(FabricError::Cuda(format!(
                "the IPC allocation has {size} bytes, fewer than {len}"
            )));
        }
        Ok(dm)
    }

    /// Exports this allocation for another process (`cuIpcGetMemHandle`):
    /// what a tenant sends the host-shim to register GPU memory.
    pub fn ipc_handle(&self) -> Result<IpcMemHandle> {
        let api = api()?;
        self.make_current()?;
        let mut handle = IpcMemHandle([0; 64]);
        // SAFETY: `handle` is a valid out-pointer of the API's 64-byte type
        // (repr(C)); `dptr` is this allocation's base pointer.
        let rc = unsafe { (api.ipc_get)(&mut handle, self.dptr) };
        check(api, rc, "cuIpcGetMemHandle")?;
        Ok(handle)
    }

    fn make_current(&self) -> Result<()> {
        let api = api()?;
        // SAFETY: `ctx` is a retained primary context.
        let rc = unsafe { (api.ctx_set_current)(self.ctx) };
        check(api, rc, "cuCtxSetCurrent")
    }

    /// The device pointer.
    pub fn dptr(&self) -> u64 {
        self.dptr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the allocation is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the driver classifies the pointer as device memory.
    pub fn is_device_memory(&self) -> Result<bool> {
        let api = api()?;
        self.make_current()?;
        let mut ty: c_uint = 0;
        // SAFETY: `ty` is a valid out-location of the attribute's size.
        let rc = unsafe {
            (api.pointer_get_attribute)(
                (&mut ty as *mut c_uint).cast(),
                ATTR_MEMORY_TYPE,
                self.dptr,
            )
        };
        check(api, rc, "cuPointerGetAttribute")?;
        Ok(ty == MEMORYTYPE_DEVICE)
    }

    /// Base and size of the allocation containing the pointer.
    pub fn address_range(&self) -> Result<(u64, u64)> {
        let api = api()?;
        self.make_current()?;
        let (mut base, mut size) = (0u64, 0usize);
        // SAFETY: out-pointers valid.
        let rc = unsafe { (api.get_address_range)(&mut base, &mut size, self.dptr) };
        check(api, rc, "cuMemGetAddressRange")?;
        Ok((base, size as u64))
    }

    /// A dma-buf fd for the whole allocation and the offset of this memory's
    /// first byte in it (for `ibv_reg_dmabuf_mr`).
    pub fn dmabuf(&self) -> Result<(OwnedFd, u64)> {
        let api = api()?;
        let (base, size) = self.address_range()?;
        let mut fd: c_int = -1;
        // SAFETY: `fd` is a valid out-location for an int handle.
        let rc = unsafe {
            (api.get_handle_for_range)(
                (&mut fd as *mut c_int).cast(),
                base,
                size as usize,
                RANGE_HANDLE_DMA_BUF_FD,
                0,
            )
        };
        check(api, rc, "cuMemGetHandleForAddressRange(DMA_BUF_FD)")?;
        // SAFETY: the driver returned a fresh fd that we now own.
        Ok((unsafe { OwnedFd::from_raw_fd(fd) }, self.dptr - base))
    }

    fn check_range(&self, offset: usize, n: usize) -> Result<()> {
        match offset.checked_add(n) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(FabricError::InvalidArgument(format!(
                "device copy {offset}+{n} outside {} bytes",
                self.len
            ))),
        }
    }

    /// Copies host bytes to the device at `offset` (`cuMemcpyHtoD`).
    pub fn copy_from_host(&self, offset: usize, src: &[u8]) -> Result<()> {
        self.check_range(offset, src.len())?;
        let api = api()?;
        self.make_current()?;
        // SAFETY: the device range was checked; `src` is readable for its length.
        let rc =
            unsafe { (api.memcpy_htod)(self.dptr + offset as u64, src.as_ptr().cast(), src.len()) };
        check(api, rc, "cuMemcpyHtoD")
    }

    /// Copies device bytes at `offset` to the host (`cuMemcpyDtoH`).
    pub fn copy_to_host(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.check_range(offset, dst.len())?;
        let api = api()?;
        self.make_current()?;
        // SAFETY: the device range was checked; `dst` is writable for its length.
        let rc = unsafe {
            (api.memcpy_dtoh)(
                dst.as_mut_ptr().cast(),
                self.dptr + offset as u64,
                dst.len(),
            )
        };
        check(api, rc, "cuMemcpyDtoH")
    }
}

impl Drop for DeviceMemory {
    fn drop(&mut self) {
        let Ok(api) = api() else { return };
        if self.make_current().is_ok() && self.dptr != 0 {
            // SAFETY: freeing / closing exactly what we allocated / opened, once.
            unsafe {
                match self.owner {
                    Owner::Alloc => (api.mem_free)(self.dptr),
                    Owner::Ipc => (api.ipc_close)(self.dptr),
                };
            }
        }
        // SAFETY: releasing the primary-context reference we retained.
        unsafe { (api.primary_ctx_release)(self.device) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_driver_errors_are_typed() {
        match DeviceMemory::alloc(0, 4096) {
            Ok(m) => assert_eq!(m.len(), 4096),
            Err(FabricError::Cuda(msg)) => assert!(!msg.is_empty()),
            Err(e) => panic!("expected a CUDA error, got {e}"),
        }
    }

    #[test]
    #[ignore = "needs an NVIDIA GPU whose driver exports dma-buf (the test-only stand-in does \
                not); on a GPU host: cargo test -p fabric --features cuda --lib cuda -- --ignored"]
    fn alloc_copy_roundtrip_and_dmabuf() {
        let m = DeviceMemory::alloc(0, 1 << 20).unwrap();
        assert!(m.is_device_memory().unwrap());
        let data: Vec<u8> = (0..1 << 20).map(|i| i as u8).collect();
        m.copy_from_host(0, &data).unwrap();
        let mut back = vec![0u8; 1 << 20];
        m.copy_to_host(0, &mut back).unwrap();
        assert_eq!(back, data);
        let (base, size) = m.address_range().unwrap();
        assert!(base <= m.dptr() && size >= 1 << 20);
        let (_fd, off) = m.dmabuf().unwrap();
        assert_eq!(off, m.dptr() - base);
    }
}
