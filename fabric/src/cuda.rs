//! CUDA device memory as a memory source (feature `cuda`).
//!
//! `libcuda.so` is loaded with `dlopen` at run time (libloading), so the crate
//! builds and runs without CUDA installed; every entry point then fails with
//! [`FabricError::Cuda`]. Used entry points: `cuInit`, `cuDeviceGet`,
//! `cuDevicePrimaryCtxRetain/Release`, `cuCtxSetCurrent`, `cuMemAlloc`,
//! `cuMemFree`, `cuMemcpyHtoD/DtoH` (the tcp backend's bounce path),
//! `cuMemGetAddressRange`, `cuPointerGetAttribute`,
//! `cuMemGetHandleForAddressRange` (a dma-buf fd for `ibv_reg_dmabuf_mr`) and
//! `cuIpcGetMemHandle/OpenMemHandle/CloseMemHandle` (legacy memory sharing
//! between processes), and the virtual memory management entry points
//! `cuMemCreate`, `cuMemRelease`, `cuMemExportToShareableHandle`,
//! `cuMemImportFromShareableHandle`, `cuMemGetAllocationPropertiesFromHandle`,
//! `cuMemGetAllocationGranularity`, `cuMemAddressReserve/Free`,
//! `cuMemMap/Unmap` and `cuMemSetAccess` (memory shared as a POSIX file
//! descriptor, `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`).
//!
//! Sharing by file descriptor is what the host-shim takes from tenants: the
//! fd is a kernel object that only a process holding it can pass on
//! (`SCM_RIGHTS`), whereas a legacy `CUipcMemHandle` is 64 bytes that anyone
//! who learns them can open.

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::fmt;
use std::os::fd::{AsRawFd as _, BorrowedFd, FromRawFd, OwnedFd};
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
/// `CU_MEM_ALLOCATION_TYPE_PINNED`.
const ALLOCATION_TYPE_PINNED: c_int = 1;
/// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`.
const HANDLE_TYPE_POSIX_FD: c_int = 1;
/// `CU_MEM_LOCATION_TYPE_DEVICE`.
const LOCATION_TYPE_DEVICE: c_int = 1;
/// `CU_MEM_ACCESS_FLAGS_PROT_READWRITE`.
const ACCESS_READWRITE: c_int = 3;
/// `CU_MEM_ALLOC_GRANULARITY_MINIMUM`.
const GRANULARITY_MINIMUM: c_int = 0;

type MemHandle = u64;

/// `CUmemLocation`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct MemLocation {
    kind: c_int,
    id: c_int,
}

/// `CUmemAllocationProp` (cuda.h layout).
#[repr(C)]
#[derive(Clone, Copy)]
struct AllocationProp {
    kind: c_int,
    requested_handle_types: c_int,
    location: MemLocation,
    win32_handle_meta_data: *mut c_void,
    /// `allocFlags`: compressionType, gpuDirectRDMACapable, usage (u16),
    /// reserved[4].
    alloc_flags: [u8; 8],
}

impl AllocationProp {
    fn device(ordinal: CuDevice, handle_types: c_int) -> AllocationProp {
        AllocationProp {
            kind: ALLOCATION_TYPE_PINNED,
            requested_handle_types: handle_types,
            location: MemLocation {
                kind: LOCATION_TYPE_DEVICE,
                id: ordinal,
            },
            win32_handle_meta_data: std::ptr::null_mut(),
            alloc_flags: [0; 8],
        }
    }
}

/// `CUmemAccessDesc`.
#[repr(C)]
struct AccessDesc {
    location: MemLocation,
    flags: c_int,
}

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
    mem_create: unsafe extern "C" fn(*mut MemHandle, usize, *const AllocationProp, u64) -> CuResult,
    mem_release: unsafe extern "C" fn(MemHandle) -> CuResult,
    mem_export: unsafe extern "C" fn(*mut c_void, MemHandle, c_int, u64) -> CuResult,
    mem_import: unsafe extern "C" fn(*mut MemHandle, *mut c_void, c_int) -> CuResult,
    mem_properties: unsafe extern "C" fn(*mut AllocationProp, MemHandle) -> CuResult,
    mem_granularity: unsafe extern "C" fn(*mut usize, *const AllocationProp, c_int) -> CuResult,
    address_reserve:
        unsafe extern "C" fn(*mut CuDevicePtr, usize, usize, CuDevicePtr, u64) -> CuResult,
    address_free: unsafe extern "C" fn(CuDevicePtr, usize) -> CuResult,
    mem_map: unsafe extern "C" fn(CuDevicePtr, usize, usize, MemHandle, u64) -> CuResult,
    mem_unmap: unsafe extern "C" fn(CuDevicePtr, usize) -> CuResult,
    mem_set_access: unsafe extern "C" fn(CuDevicePtr, usize, *const AccessDesc, usize) -> CuResult,
    error_string: unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult,
}

/// Why the CUDA driver API could not be loaded (kept for the process's
/// life: every later use fails the same way).
#[derive(Debug, Clone, thiserror::Error)]
enum LoadError {
    /// Neither library name loads; both reasons.
    #[error(
        "cannot load libcuda.so.1 ({first}) nor libcuda.so ({second}); is the NVIDIA driver installed?"
    )]
    Library { first: String, second: String },
    /// The library loads but lacks a function.
    #[error("libcuda lacks {name}: {reason}")]
    Symbol { name: String, reason: String },
    /// `cuInit` failed: the driver's text for its code.
    #[error("cuInit: {0}")]
    Init(String),
}

fn load() -> std::result::Result<Api, LoadError> {
    // SAFETY: loading the CUDA driver library runs its initialisers, which
    // is what every CUDA program does; we call nothing before cuInit.
    let lib = unsafe { libloading::Library::new("libcuda.so.1") }.or_else(|first| {
        // SAFETY: as above.
        unsafe { libloading::Library::new("libcuda.so") }.map_err(|second| {
            // Both reasons: the first is the one that matters when
            // libcuda.so.1 exists but does not load.
            LoadError::Library {
                first: first.to_string(),
                second: second.to_string(),
            }
        })
    })?;
    macro_rules! sym {
        ($name:literal) => {
            // SAFETY: the symbol has the C signature of the CUDA driver API
            // function of that name (cuda.h), matching the field's type.
            *unsafe { lib.get($name) }.map_err(|e| LoadError::Symbol {
                name: String::from_utf8_lossy($name).into_owned(),
                reason: e.to_string(),
            })?
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
        mem_create: sym!(b"cuMemCreate\0"),
        mem_release: sym!(b"cuMemRelease\0"),
        mem_export: sym!(b"cuMemExportToShareableHandle\0"),
        mem_import: sym!(b"cuMemImportFromShareableHandle\0"),
        mem_properties: sym!(b"cuMemGetAllocationPropertiesFromHandle\0"),
        mem_granularity: sym!(b"cuMemGetAllocationGranularity\0"),
        address_reserve: sym!(b"cuMemAddressReserve\0"),
        address_free: sym!(b"cuMemAddressFree\0"),
        mem_map: sym!(b"cuMemMap\0"),
        mem_unmap: sym!(b"cuMemUnmap\0"),
        mem_set_access: sym!(b"cuMemSetAccess\0"),
        error_string: sym!(b"cuGetErrorString\0"),
        _lib: lib,
    };
    // SAFETY: cuInit(0) is the documented first call.
    let rc = unsafe { (api.init)(0) };
    if rc != 0 {
        return Err(LoadError::Init(describe(&api, rc)));
    }
    Ok(api)
}

fn api() -> Result<&'static Api> {
    static API: OnceLock<std::result::Result<Api, LoadError>> = OnceLock::new();
    API.get_or_init(load)
        .as_ref()
        .map_err(|e| FabricError::Cuda(e.to_string()))
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
    /// A VMM mapping of `mapped` bytes at `dptr` (the whole reservation);
    /// `handle` is kept for allocations of ours (to export them), released
    /// at once for imports (the mapping holds the memory).
    Vmm {
        handle: Option<MemHandle>,
        mapped: usize,
    },
}

/// Device memory in the primary context of one GPU: allocated by us (with
/// `cuMemAlloc`, or with `cuMemCreate` to share it as a file descriptor),
/// opened from another process's legacy IPC handle, or imported from its
/// file descriptor. Freed / closed / unmapped on drop.
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

/// `len` rounded up to the minimum granularity of allocations like `prop`.
fn round_to_granularity(api: &Api, prop: &AllocationProp, len: usize) -> Result<usize> {
    let mut gran: usize = 0;
    // SAFETY: out-pointer valid; `prop` is a valid CUmemAllocationProp.
    let rc = unsafe { (api.mem_granularity)(&mut gran, prop, GRANULARITY_MINIMUM) };
    check(api, rc, "cuMemGetAllocationGranularity")?;
    let gran = gran.max(1);
    len.div_ceil(gran)
        .checked_mul(gran)
        .ok_or_else(|| FabricError::InvalidArgument(format!("{len} bytes cannot be mapped")))
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
        if matches!(self.owner, Owner::Vmm { .. }) {
            return Err(FabricError::InvalidArgument(
                "VMM memory is shared with export_fd, not a legacy IPC handle".into(),
            ));
        }
        let mut handle = IpcMemHandle([0; 64]);
        // SAFETY: `handle` is a valid out-pointer of the API's 64-byte type
        // (repr(C)); `dptr` is this allocation's base pointer.
        let rc = unsafe { (api.ipc_get)(&mut handle, self.dptr) };
        check(api, rc, "cuIpcGetMemHandle")?;
        Ok(handle)
    }

    /// Allocates `len` bytes on GPU `ordinal` that can be shared as a POSIX
    /// file descriptor ([`DeviceMemory::export_fd`]): `cuMemCreate` with
    /// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`, mapped here read-write.
    /// The allocation is `len` rounded up to the driver's granularity.
    pub fn alloc_shareable(ordinal: i32, len: usize) -> Result<DeviceMemory> {
        let api = api()?;
        let (device, ctx) = primary_ctx(api, ordinal)?;
        let mut dm = DeviceMemory {
            dptr: 0,
            len,
            device,
            ctx,
            owner: Owner::Vmm {
                handle: None,
                mapped: 0,
            },
        };
        dm.make_current()?;
        let prop = AllocationProp::device(device, HANDLE_TYPE_POSIX_FD);
        let size = round_to_granularity(api, &prop, len.max(1))?;
        let mut handle: MemHandle = 0;
        // SAFETY: out-pointer valid; `prop` is a valid CUmemAllocationProp.
        let rc = unsafe { (api.mem_create)(&mut handle, size, &prop, 0) };
        check(api, rc, "cuMemCreate")?;
        dm.owner = Owner::Vmm {
            handle: Some(handle),
            mapped: 0,
        };
        dm.map_vmm(api, handle, size)?;
        Ok(dm)
    }

    /// Imports device memory that another process exported as a POSIX file
    /// descriptor (`cuMemExportToShareableHandle` with
    /// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`; the host-shim's path for
    /// tenant GPU buffers) and maps its first `len` bytes (rounded up to the
    /// driver's granularity) read-write on GPU `ordinal`. The driver keeps
    /// its own reference: `fd` may be closed afterwards.
    ///
    /// # Errors
    /// [`FabricError::Cuda`]: the fd is no CUDA shareable handle, the
    /// allocation is on another device, or it is smaller than `len`.
    pub fn import_fd(ordinal: i32, fd: BorrowedFd<'_>, len: usize) -> Result<DeviceMemory> {
        let api = api()?;
        let (device, ctx) = primary_ctx(api, ordinal)?;
        let mut dm = DeviceMemory {
            dptr: 0,
            len,
            device,
            ctx,
            owner: Owner::Vmm {
                handle: None,
                mapped: 0,
            },
        };
        dm.make_current()?;
        let mut handle: MemHandle = 0;
        // SAFETY: out-pointer valid; for POSIX fds the API takes the fd
        // number as the pointer value, and `fd` is open for this call.
        let rc = unsafe {
            (api.mem_import)(
                &mut handle,
                fd.as_raw_fd() as isize as *mut c_void,
                HANDLE_TYPE_POSIX_FD,
            )
        };
        check(
            api,
            rc,
            "cuMemImportFromShareableHandle(POSIX_FILE_DESCRIPTOR)",
        )?;
        // From here the handle is ours to release, mapped or not.
        let mapped = dm.map_import(api, handle, ordinal);
        // SAFETY: releasing the imported handle once; a mapping made from
        // it keeps the memory until cuMemUnmap.
        unsafe { (api.mem_release)(handle) };
        mapped.map(|()| dm)
    }

    /// Maps the first `self.len` bytes of the imported allocation `handle`,
    /// which must be on this memory's device.
    fn map_import(&mut self, api: &Api, handle: MemHandle, ordinal: i32) -> Result<()> {
        let len = self.len;
        let mut prop = AllocationProp::device(0, 0);
        // SAFETY: out-pointer of the API's struct type; `handle` is live.
        let rc = unsafe { (api.mem_properties)(&mut prop, handle) };
        check(api, rc, "cuMemGetAllocationPropertiesFromHandle")?;
        if prop.location.kind != LOCATION_TYPE_DEVICE || prop.location.id != self.device {
            return Err(FabricError::Cuda(format!(
                "the shared allocation is on device {} (location type {}), not device {ordinal}",
                prop.location.id, prop.location.kind
            )));
        }
        let size = round_to_granularity(api, &prop, len.max(1))?;
        self.map_vmm(api, handle, size).map_err(|e| {
            FabricError::Cuda(format!(
                "{e}: the shared allocation has fewer than the {len} bytes asked \
                 (mapped as {size}, the driver's granularity)"
            ))
        })
    }

    /// Reserves `size` bytes of device address space, maps `handle` there
    /// and grants this device read-write access. On failure nothing stays
    /// reserved or mapped.
    fn map_vmm(&mut self, api: &Api, handle: MemHandle, size: usize) -> Result<()> {
        let mut ptr: CuDevicePtr = 0;
        // SAFETY: out-pointer valid; no fixed address asked (0).
        let rc = unsafe { (api.address_reserve)(&mut ptr, size, 0, 0, 0) };
        check(api, rc, "cuMemAddressReserve")?;
        // SAFETY: `ptr` is a fresh reservation of `size` bytes.
        let rc = unsafe { (api.mem_map)(ptr, size, 0, handle, 0) };
        if let Err(e) = check(api, rc, "cuMemMap") {
            // SAFETY: freeing the reservation just made, with nothing mapped.
            unsafe { (api.address_free)(ptr, size) };
            return Err(e);
        }
        let desc = AccessDesc {
            location: MemLocation {
                kind: LOCATION_TYPE_DEVICE,
                id: self.device,
            },
            flags: ACCESS_READWRITE,
        };
        // SAFETY: `[ptr, ptr+size)` is mapped; one descriptor is passed.
        let rc = unsafe { (api.mem_set_access)(ptr, size, &desc, 1) };
        if let Err(e) = check(api, rc, "cuMemSetAccess") {
            // SAFETY: undoing the mapping and reservation just made.
            unsafe {
                (api.mem_unmap)(ptr, size);
                (api.address_free)(ptr, size);
            }
            return Err(e);
        }
        self.dptr = ptr;
        if let Owner::Vmm { mapped, .. } = &mut self.owner {
            *mapped = size;
        }
        Ok(())
    }

    /// Exports this allocation as a POSIX file descriptor
    /// (`cuMemExportToShareableHandle`): what a tenant passes the host-shim,
    /// over its lease, to register GPU memory. Only for memory from
    /// [`DeviceMemory::alloc_shareable`].
    pub fn export_fd(&self) -> Result<OwnedFd> {
        let api = api()?;
        let Owner::Vmm {
            handle: Some(handle),
            ..
        } = self.owner
        else {
            return Err(FabricError::InvalidArgument(
                "only memory from DeviceMemory::alloc_shareable can be exported as an fd".into(),
            ));
        };
        self.make_current()?;
        let mut fd: c_int = -1;
        // SAFETY: `fd` is a valid out-location for an int handle.
        let rc = unsafe {
            (api.mem_export)(
                (&mut fd as *mut c_int).cast(),
                handle,
                HANDLE_TYPE_POSIX_FD,
                0,
            )
        };
        check(
            api,
            rc,
            "cuMemExportToShareableHandle(POSIX_FILE_DESCRIPTOR)",
        )?;
        // SAFETY: the driver returned a fresh fd that we now own.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
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
                    Owner::Vmm { mapped, .. } => {
                        (api.mem_unmap)(self.dptr, mapped);
                        (api.address_free)(self.dptr, mapped)
                    }
                };
            }
        }
        if let Owner::Vmm {
            handle: Some(handle),
            ..
        } = self.owner
        {
            // SAFETY: releasing our allocation's handle once (its mapping,
            // if any, is gone above).
            unsafe { (api.mem_release)(handle) };
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
