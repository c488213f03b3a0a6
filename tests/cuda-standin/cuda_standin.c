/*
 * A TEST-ONLY stand-in for the CUDA driver library (libcuda.so.1).
 *
 * It exports exactly the driver entry points fabric's `cuda` feature loads
 * (fabric/src/cuda.rs), so that feature's code and the host-shim's CUDA
 * buffer path run in CI on machines without an NVIDIA GPU. Build it with
 * tests/cuda-standin/build.sh and point LD_LIBRARY_PATH at its directory;
 * .ci/cuda-standin.sh does both. It is never installed, packaged or copied
 * into an image: it only ever lives under target/.
 *
 * What it models (documented CUDA driver API semantics):
 *  - cuInit(0) must come first: every other entry point answers
 *    CUDA_ERROR_NOT_INITIALIZED before it (cuGetErrorString excepted, as in
 *    CUDA); cuInit with flags != 0 is CUDA_ERROR_INVALID_VALUE.
 *  - One device, ordinal 0 (others: CUDA_ERROR_INVALID_DEVICE), with a
 *    reference-counted primary context. Calls that need a context fail with
 *    CUDA_ERROR_INVALID_CONTEXT unless one is current on the calling thread
 *    (cuCtxSetCurrent is per thread). Releasing the last reference resets the
 *    context: every allocation and IPC mapping made in it is freed / closed.
 *  - Device memory is not addressable by the CPU: a CUdeviceptr is the
 *    address of a PROT_NONE reservation, so a CPU load or store through it
 *    faults as it would on a GPU; the bytes live in a separate shared-memory
 *    (memfd) mapping that only the cuMemcpy* entry points touch. Fresh
 *    allocations are filled with 0xA5 (cuMemAlloc does not clear memory).
 *  - cuMemcpyHtoD/DtoH need the whole device range inside one allocation or
 *    IPC mapping (else CUDA_ERROR_INVALID_VALUE); cuMemFree takes only the
 *    base of a cuMemAlloc allocation; cuMemGetAddressRange answers base and
 *    size for any address inside one (else CUDA_ERROR_NOT_FOUND);
 *    cuPointerGetAttribute answers MEMORY_TYPE = DEVICE, CONTEXT,
 *    DEVICE_POINTER, DEVICE_ORDINAL, IS_MANAGED, RANGE_START_ADDR and
 *    RANGE_SIZE for such addresses, CUDA_ERROR_INVALID_VALUE for anything
 *    else (HOST_POINTER of device memory included).
 *  - IPC: cuIpcGetMemHandle names the allocation containing the pointer in a
 *    64-byte handle (magic, version, exporting pid, its memfd's fd number,
 *    inode, size, a per-process generation, a checksum). cuIpcOpenMemHandle
 *    in another process of the same user (or root) maps the same memory
 *    through /proc/PID/fd/FD, so bytes written on either side are seen on
 *    the other. A handle that is not one (bad magic, version or checksum) or
 *    bad flags: CUDA_ERROR_INVALID_VALUE; a handle whose allocation was freed,
 *    or whose exporting process is gone: CUDA_ERROR_INVALID_HANDLE; a handle
 *    opened in the process that exported it: CUDA_ERROR_INVALID_CONTEXT.
 *    Opening the same handle again in one process returns the same pointer
 *    and counts references; cuIpcCloseMemHandle unmaps at the last one.
 *  - cuMemFree of memory another process still has open is undefined
 *    behaviour in CUDA; here the importer's mapping stays valid but the
 *    exporter fills the bytes with 0xDD first (the contents are gone), and
 *    the handle is stale from then on.
 *  - Virtual memory management (the VMM API) with POSIX fd shareable handles:
 *    cuMemGetAllocationGranularity answers 2 MiB (minimum and recommended,
 *    as on current GPUs); cuMemCreate takes a multiple of it on device 0
 *    (pinned, requestedHandleTypes 0 or POSIX_FILE_DESCRIPTOR) and backs it
 *    with a memfd named s3dma-cuda-standin:PID:vmm-GEN:DEVICE, sealed so it
 *    can neither shrink nor grow. cuMemExportToShareableHandle(POSIX_FD)
 *    answers a new fd of that memfd (only for allocations created with that
 *    handle type requested: else CUDA_ERROR_INVALID_VALUE), so another
 *    process that receives it (SCM_RIGHTS) maps the same bytes.
 *    cuMemImportFromShareableHandle(POSIX_FD) takes the fd as the pointer
 *    value (as CUDA does), accepts only such a memfd (by its name and seals;
 *    anything else: CUDA_ERROR_INVALID_HANDLE; a negative fd or another
 *    handle type: CUDA_ERROR_INVALID_VALUE) and keeps its own reference, so
 *    the fd may be closed at once. cuMemGetAllocationPropertiesFromHandle
 *    answers type, location and requested handle types. cuMemAddressReserve
 *    reserves PROT_NONE address space (a multiple of the granularity);
 *    cuMemMap maps a whole allocation or its first part (offset 0, size a
 *    multiple of the granularity, within the allocation and a reservation,
 *    else CUDA_ERROR_INVALID_VALUE); the mapping is device memory for every
 *    entry point above, but copies fail with CUDA_ERROR_INVALID_VALUE until
 *    cuMemSetAccess grants READWRITE on the device. cuMemUnmap takes a
 *    mapping's base and size; cuMemAddressFree refuses a reservation that
 *    still has mappings. An allocation lives while its handle (cuMemRelease
 *    drops it) or a mapping holds it; an exported fd holds its bytes, not
 *    the handle. None of this belongs to a context: a context reset leaves
 *    VMM allocations and mappings alone.
 *  - cuMemGetHandleForAddressRange (dma-buf export for GPUDirect RDMA)
 *    answers CUDA_ERROR_NOT_SUPPORTED, as on a GPU or driver without dma-buf.
 *  - cuGetErrorString knows the codes it returns (others: INVALID_VALUE and
 *    a NULL string, as CUDA does for unknown codes).
 *  - The numeric error codes are those of cuda.h.
 *
 * What it does not model: kernels, streams and asynchronous copies, peer
 * access and more than one device, unified/managed memory, device memory
 * that the NIC can DMA to (GPUDirect), real capacity (a soft limit of
 * S3DMA_CUDA_STANDIN_MEMORY bytes, default 4 GiB, per process gives
 * CUDA_ERROR_OUT_OF_MEMORY), fork(), handles across users or pid namespaces,
 * cuCtxCreate and every entry point fabric does not load.
 *
 * S3DMA_CUDA_STANDIN_TRACE=1 prints each call to stderr;
 * S3DMA_CUDA_STANDIN_NO_DEVICE=1 makes cuInit answer CUDA_ERROR_NO_DEVICE
 * (a machine whose driver loads but sees no GPU).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#define API __attribute__((visibility("default")))

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct {
    char reserved[64];
} CUipcMemHandle;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct {
    int type; /* CUmemLocationType */
    int id;
} CUmemLocation;
typedef struct {
    int type;                 /* CUmemAllocationType */
    int requestedHandleTypes; /* CUmemAllocationHandleType */
    CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;
typedef struct {
    CUmemLocation location;
    int flags; /* CUmemAccess_flags */
} CUmemAccessDesc;

/* cuda.h error codes. */
enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_MAP_FAILED = 205,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_SUPPORTED = 801,
    CUDA_ERROR_UNKNOWN = 999,
};

/* cuda.h enum values used here. */
enum {
    CU_POINTER_ATTRIBUTE_CONTEXT = 1,
    CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
    CU_POINTER_ATTRIBUTE_DEVICE_POINTER = 3,
    CU_POINTER_ATTRIBUTE_HOST_POINTER = 4,
    CU_POINTER_ATTRIBUTE_IS_MANAGED = 8,
    CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
    CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11,
    CU_POINTER_ATTRIBUTE_RANGE_SIZE = 12,
    CU_MEMORYTYPE_DEVICE = 2,
    CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 1,
    CU_MEM_ALLOCATION_TYPE_PINNED = 1,
    CU_MEM_HANDLE_TYPE_NONE = 0,
    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1,
    CU_MEM_LOCATION_TYPE_DEVICE = 1,
    CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3,
    CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0,
    CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 1,
};

#define DEVICES 1
#define POISON_FRESH 0xA5
#define POISON_FREED 0xDD
#define HANDLE_MAGIC "s3dmaCSI"
#define HANDLE_VERSION 1u
#define MEMFD_PREFIX "s3dma-cuda-standin"
#define VMM_GRANULARITY ((size_t)2 << 20)

struct CUctx_st {
    CUdevice device;
    unsigned refs;
};

/* One allocation (cuMemAlloc) or IPC mapping (cuIpcOpenMemHandle). */
struct block {
    uintptr_t dptr;   /* the PROT_NONE reservation: what callers see */
    size_t size;      /* bytes asked for */
    size_t map_len;   /* size rounded up to pages */
    unsigned char *bytes; /* the shared-memory mapping holding the bytes */
    int fd;           /* the memfd (allocations only; -1 for IPC mappings) */
    int imported;     /* 1 for IPC mappings */
    int exported;     /* an IPC handle was made for it */
    unsigned refs;    /* IPC mappings: opens in this process */
    pid_t pid;        /* the exporting process */
    uint64_t gen;     /* the exporter's generation of the allocation */
    uint64_t ino;     /* the memfd's inode */
    struct CUctx_st *ctx;
    struct vmm *vmm;  /* VMM mappings (cuMemMap): the allocation mapped */
    int access;       /* VMM mappings: cuMemSetAccess granted READWRITE */
};

/* A VMM allocation (cuMemCreate or cuMemImportFromShareableHandle). */
struct vmm {
    CUmemGenericAllocationHandle handle; /* 0 once released */
    int fd;          /* its memfd (this process's own descriptor) */
    size_t size;
    int device;
    int handle_types;
    int imported;
    unsigned maps;   /* mappings of it */
    struct vmm *next;
};

/* Address space reserved with cuMemAddressReserve. */
struct reservation {
    uintptr_t base;
    size_t size;
    struct reservation *next;
};

/* The wire form of an IPC handle: exactly 64 bytes. */
struct wire_handle {
    char magic[8];
    uint32_t version;
    int32_t pid;
    int32_t fd;
    uint32_t device;
    uint64_t ino;
    uint64_t dev;
    uint64_t size;
    uint64_t gen;
    uint64_t check;
};
_Static_assert(sizeof(struct wire_handle) == sizeof(CUipcMemHandle), "64-byte handle");

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_int initialized;
static atomic_int trace;
static struct CUctx_st contexts[DEVICES];
static struct block *blocks;
static size_t nblocks, cap_blocks;
static uint64_t next_gen = 1;
static size_t allocated, memory_limit;
static struct vmm *vmms;
static struct reservation *reservations;
static CUmemGenericAllocationHandle next_vmm_handle = 1;
static __thread struct CUctx_st *current;

#define TRACE(...)                                                                                 \
    do {                                                                                           \
        if (trace) {                                                                               \
            fprintf(stderr, "cuda-standin[%d]: ", (int)getpid());                                  \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
        }                                                                                          \
    } while (0)

static size_t page_round(size_t n)
{
    size_t ps = (size_t)sysconf(_SC_PAGESIZE);
    return (n + ps - 1) / ps * ps;
}

static uint64_t checksum(const struct wire_handle *h)
{
    /* FNV-1a over every byte before `check`. */
    const unsigned char *p = (const unsigned char *)h;
    uint64_t x = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < offsetof(struct wire_handle, check); i++) {
        x ^= p[i];
        x *= 0x100000001b3ull;
    }
    return x;
}

/* The block containing [p, p+n) (n may be 0: the block containing p). Lock held. */
static struct block *find(uintptr_t p, size_t n)
{
    for (size_t i = 0; i < nblocks; i++) {
        struct block *b = &blocks[i];
        if (p >= b->dptr && p - b->dptr < b->size && n <= b->size - (p - b->dptr))
            return b;
    }
    return NULL;
}

static void unmap_block(struct block *b)
{
    munmap(b->bytes, b->map_len);
    if (b->vmm) {
        /* The address space stays reserved (cuMemAddressFree gives it back). */
        mmap((void *)b->dptr, b->map_len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
        return;
    }
    munmap((void *)b->dptr, b->map_len);
    if (b->fd >= 0)
        close(b->fd);
    if (!b->imported)
        allocated -= b->map_len;
}

/* Removes blocks[i] (lock held). */
static void drop_block(size_t i)
{
    unmap_block(&blocks[i]);
    blocks[i] = blocks[--nblocks];
}

static int add_block(const struct block *b)
{
    if (nblocks == cap_blocks) {
        size_t cap = cap_blocks ? cap_blocks * 2 : 16;
        struct block *nb = realloc(blocks, cap * sizeof *nb);
        if (!nb)
            return -1;
        blocks = nb;
        cap_blocks = cap;
    }
    blocks[nblocks++] = *b;
    return 0;
}

/* Reserves device address space and maps fd's bytes: fills b->dptr, b->bytes. */
static CUresult map_device(struct block *b, int fd)
{
    void *res = mmap(NULL, b->map_len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (res == MAP_FAILED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    void *bytes = mmap(NULL, b->map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (bytes == MAP_FAILED) {
        munmap(res, b->map_len);
        return b->imported ? CUDA_ERROR_MAP_FAILED : CUDA_ERROR_OUT_OF_MEMORY;
    }
    b->dptr = (uintptr_t)res;
    b->bytes = bytes;
    return CUDA_SUCCESS;
}

static CUresult need_init(void)
{
    return initialized ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}

/* Initialised and a live context current on this thread. */
static CUresult need_context(void)
{
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&lock);
    int live = current && current->refs > 0;
    pthread_mutex_unlock(&lock);
    return live ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

API CUresult cuInit(unsigned int flags)
{
    const char *t = getenv("S3DMA_CUDA_STANDIN_TRACE");
    trace = t && *t && strcmp(t, "0") != 0;
    TRACE("cuInit(%u)", flags);
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    const char *none = getenv("S3DMA_CUDA_STANDIN_NO_DEVICE");
    if (none && *none && strcmp(none, "0") != 0)
        return CUDA_ERROR_NO_DEVICE;
    pthread_mutex_lock(&lock);
    if (!initialized) {
        const char *m = getenv("S3DMA_CUDA_STANDIN_MEMORY");
        char *end = NULL;
        unsigned long long v = m ? strtoull(m, &end, 10) : 0;
        memory_limit = (m && end != m && *end == '\0' && v > 0) ? (size_t)v : (size_t)4 << 30;
        for (int d = 0; d < DEVICES; d++)
            contexts[d].device = d;
        initialized = 1;
    }
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
    TRACE("cuDeviceGet(%d)", ordinal);
    CUresult rc = need_init();
    if (rc)
        return rc;
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    if (ordinal < 0 || ordinal >= DEVICES)
        return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

API CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    TRACE("cuDevicePrimaryCtxRetain(%d)", dev);
    CUresult rc = need_init();
    if (rc)
        return rc;
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= DEVICES)
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&lock);
    contexts[dev].refs++;
    *pctx = &contexts[dev];
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    TRACE("cuDevicePrimaryCtxRelease_v2(%d)", dev);
    CUresult rc = need_init();
    if (rc)
        return rc;
    if (dev < 0 || dev >= DEVICES)
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&lock);
    struct CUctx_st *ctx = &contexts[dev];
    if (ctx->refs == 0) {
        pthread_mutex_unlock(&lock);
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    if (--ctx->refs == 0) {
        /* The last reference resets the context: its memory goes. */
        size_t i = 0;
        while (i < nblocks) {
            if (blocks[i].ctx == ctx && !blocks[i].vmm) {
                TRACE("context reset frees %#llx (%zu bytes)", (CUdeviceptr)blocks[i].dptr,
                      blocks[i].size);
                drop_block(i);
            } else {
                i++;
            }
        }
    }
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

API CUresult cuCtxSetCurrent(CUcontext ctx)
{
    TRACE("cuCtxSetCurrent(%p)", (void *)ctx);
    CUresult rc = need_init();
    if (rc)
        return rc;
    if (ctx) {
        int known = 0;
        for (int d = 0; d < DEVICES; d++)
            known |= ctx == &contexts[d];
        pthread_mutex_lock(&lock);
        int live = known && ctx->refs > 0;
        pthread_mutex_unlock(&lock);
        if (!live)
            return CUDA_ERROR_INVALID_CONTEXT;
    }
    current = ctx;
    return CUDA_SUCCESS;
}

API CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    TRACE("cuMemAlloc_v2(%zu)", bytesize);
    CUresult rc = need_context();
    if (rc)
        return rc;
    if (!dptr || bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    struct block b = {.size = bytesize, .map_len = page_round(bytesize), .fd = -1, .pid = getpid()};
    if (b.map_len < bytesize)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&lock);
    if (allocated > memory_limit || b.map_len > memory_limit - allocated) {
        pthread_mutex_unlock(&lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    b.gen = next_gen++;
    b.ctx = current;
    char name[64];
    snprintf(name, sizeof name, MEMFD_PREFIX ":%d:%llu", (int)b.pid, (unsigned long long)b.gen);
    b.fd = memfd_create(name, MFD_CLOEXEC);
    struct stat st;
    if (b.fd < 0 || ftruncate(b.fd, (off_t)b.map_len) != 0 || fstat(b.fd, &st) != 0) {
        if (b.fd >= 0)
            close(b.fd);
        pthread_mutex_unlock(&lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    b.ino = (uint64_t)st.st_ino;
    rc = map_device(&b, b.fd);
    if (rc == CUDA_SUCCESS) {
        memset(b.bytes, POISON_FRESH, b.size);
        allocated += b.map_len;
        if (add_block(&b) != 0) {
            unmap_block(&b);
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        }
    } else {
        close(b.fd);
    }
    pthread_mutex_unlock(&lock);
    if (rc == CUDA_SUCCESS) {
        *dptr = (CUdeviceptr)b.dptr;
        TRACE("cuMemAlloc_v2 -> %#llx", *dptr);
    }
    return rc;
}

API CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    TRACE("cuMemFree_v2(%#llx)", dptr);
    CUresult rc = need_context();
    if (rc)
        return rc;
    pthread_mutex_lock(&lock);
    rc = CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < nblocks; i++) {
        struct block *b = &blocks[i];
        if (b->dptr == dptr && !b->imported && !b->vmm) {
            if (b->exported) /* another process may still map it: its bytes are gone */
                memset(b->bytes, POISON_FREED, b->size);
            drop_block(i);
            rc = CUDA_SUCCESS;
            break;
        }
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

API CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n)
{
    TRACE("cuMemcpyHtoD_v2(%#llx, %zu)", dst, n);
    CUresult rc = need_context();
    if (rc)
        return rc;
    if (n == 0)
        return CUDA_SUCCESS;
    if (!src)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct block *b = find((uintptr_t)dst, n);
    if (b && b->vmm && !b->access)
        b = NULL; /* no access granted: a fault on a GPU */
    if (b)
        memcpy(b->bytes + (dst - b->dptr), src, n);
    pthread_mutex_unlock(&lock);
    return b ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

API CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n)
{
    TRACE("cuMemcpyDtoH_v2(%#llx, %zu)", src, n);
    CUresult rc = need_context();
    if (rc)
        return rc;
    if (n == 0)
        return CUDA_SUCCESS;
    if (!dst)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct block *b = find((uintptr_t)src, n);
    if (b && b->vmm && !b->access)
        b = NULL; /* no access granted: a fault on a GPU */
    if (b)
        memcpy(dst, b->bytes + (src - b->dptr), n);
    pthread_mutex_unlock(&lock);
    return b ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

API CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
    TRACE("cuMemGetAddressRange_v2(%#llx)", dptr);
    CUresult rc = need_context();
    if (rc)
        return rc;
    pthread_mutex_lock(&lock);
    struct block *b = find((uintptr_t)dptr, 0);
    if (b) {
        if (pbase)
            *pbase = (CUdeviceptr)b->dptr;
        if (psize)
            *psize = b->size;
    }
    pthread_mutex_unlock(&lock);
    return b ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

API CUresult cuPointerGetAttribute(void *data, int attribute, CUdeviceptr ptr)
{
    TRACE("cuPointerGetAttribute(%d, %#llx)", attribute, ptr);
    CUresult rc = need_init();
    if (rc)
        return rc;
    if (!data)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct block *b = find((uintptr_t)ptr, 0);
    struct block copy;
    if (b)
        copy = *b;
    pthread_mutex_unlock(&lock);
    if (!b)
        return CUDA_ERROR_INVALID_VALUE;
    switch (attribute) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
        *(CUcontext *)data = copy.ctx;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *(unsigned int *)data = CU_MEMORYTYPE_DEVICE;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
        *(CUdeviceptr *)data = ptr;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
        *(unsigned int *)data = 0;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        *(int *)data = copy.ctx->device;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
        *(CUdeviceptr *)data = (CUdeviceptr)copy.dptr;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
        *(size_t *)data = copy.size;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER: /* device memory has none */
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
}

API CUresult cuMemGetHandleForAddressRange(void *handle, CUdeviceptr dptr, size_t size,
                                           int handle_type, unsigned long long flags)
{
    TRACE("cuMemGetHandleForAddressRange(%#llx, %zu, %d, %llu)", dptr, size, handle_type, flags);
    CUresult rc = need_context();
    if (rc)
        return rc;
    if (!handle)
        return CUDA_ERROR_INVALID_VALUE;
    /* No dma-buf export: GPUDirect RDMA is what this stand-in cannot give. */
    return CUDA_ERROR_NOT_SUPPORTED;
}

API CUresult cuIpcGetMemHandle(CUipcMemHandle *handle, CUdeviceptr dptr)
{
    TRACE("cuIpcGetMemHandle(%#llx)", dptr);
    CUresult rc = need_context();
    if (rc)
        return rc;
    if (!handle)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct block *b = find((uintptr_t)dptr, 0);
    int ok = b && !b->imported && !b->vmm;
    struct wire_handle w;
    memset(&w, 0, sizeof w);
    if (ok) {
        b->exported = 1;
        memcpy(w.magic, HANDLE_MAGIC, sizeof w.magic);
        w.version = HANDLE_VERSION;
        w.pid = b->pid;
        w.fd = b->fd;
        w.device = (uint32_t)b->ctx->device;
        w.ino = b->ino;
        w.size = b->size;
        w.gen = b->gen;
        w.check = checksum(&w);
    }
    pthread_mutex_unlock(&lock);
    if (!ok)
        return CUDA_ERROR_INVALID_VALUE;
    memcpy(handle, &w, sizeof w);
    return CUDA_SUCCESS;
}

/* Opens the exporter's memfd named by `w`; -1 when it is gone or not the one. */
static int open_exported(const struct wire_handle *w)
{
    char path[64], link[256], want[96];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)w->pid, (int)w->fd);
    ssize_t n = readlink(path, link, sizeof link - 1);
    if (n < 0)
        return -1;
    link[n] = '\0';
    snprintf(want, sizeof want, "/memfd:" MEMFD_PREFIX ":%d:%llu ", (int)w->pid,
             (unsigned long long)w->gen);
    if (strncmp(link, want, strlen(want)) != 0)
        return -1;
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return -1;
    struct stat st;
    if (fstat(fd, &st) != 0 || (uint64_t)st.st_ino != w->ino ||
        (uint64_t)st.st_size < page_round(w->size)) {
        close(fd);
        return -1;
    }
    return fd;
}

API CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int flags)
{
    TRACE("cuIpcOpenMemHandle_v2(flags %u)", flags);
    CUresult rc = need_context();
    if (rc)
        return rc;
    if (!pdptr || (flags & ~(unsigned)CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS))
        return CUDA_ERROR_INVALID_VALUE;
    struct wire_handle w;
    memcpy(&w, &handle, sizeof w);
    if (memcmp(w.magic, HANDLE_MAGIC, sizeof w.magic) != 0 || w.version != HANDLE_VERSION ||
        w.check != checksum(&w) || w.size == 0 || w.size > SIZE_MAX / 2 || w.device >= DEVICES)
        return CUDA_ERROR_INVALID_VALUE;
    if (w.pid == getpid())
        return CUDA_ERROR_INVALID_CONTEXT; /* CUDA refuses handles of the same process */
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < nblocks; i++) {
        struct block *b = &blocks[i];
        if (b->imported && b->pid == w.pid && b->gen == w.gen && b->ctx == current) {
            b->refs++;
            *pdptr = (CUdeviceptr)b->dptr;
            pthread_mutex_unlock(&lock);
            return CUDA_SUCCESS;
        }
    }
    int fd = open_exported(&w);
    if (fd < 0) {
        pthread_mutex_unlock(&lock);
        TRACE("cuIpcOpenMemHandle_v2: allocation %d:%llu is gone", (int)w.pid,
              (unsigned long long)w.gen);
        return CUDA_ERROR_INVALID_HANDLE;
    }
    struct block b = {.size = (size_t)w.size,
                      .map_len = page_round((size_t)w.size),
                      .fd = -1,
                      .imported = 1,
                      .refs = 1,
                      .pid = w.pid,
                      .gen = w.gen,
                      .ino = w.ino,
                      .ctx = current};
    rc = map_device(&b, fd);
    close(fd);
    if (rc == CUDA_SUCCESS && add_block(&b) != 0) {
        unmap_block(&b);
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_unlock(&lock);
    if (rc == CUDA_SUCCESS) {
        *pdptr = (CUdeviceptr)b.dptr;
        TRACE("cuIpcOpenMemHandle_v2 -> %#llx", *pdptr);
    }
    return rc;
}

API CUresult cuIpcCloseMemHandle(CUdeviceptr dptr)
{
    TRACE("cuIpcCloseMemHandle(%#llx)", dptr);
    CUresult rc = need_context();
    if (rc)
        return rc;
    pthread_mutex_lock(&lock);
    rc = CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < nblocks; i++) {
        struct block *b = &blocks[i];
        if (b->dptr == dptr && b->imported && !b->vmm) {
            if (--b->refs == 0)
                drop_block(i);
            rc = CUDA_SUCCESS;
            break;
        }
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

/* ---- Virtual memory management with POSIX fd shareable handles ---- */

/* The live VMM allocation of `handle` (lock held). */
static struct vmm *find_vmm(CUmemGenericAllocationHandle handle)
{
    for (struct vmm *v = vmms; v; v = v->next)
        if (v->handle == handle && handle != 0)
            return v;
    return NULL;
}

/* Frees `v` once neither its handle nor a mapping holds it (lock held). */
static void maybe_free_vmm(struct vmm *v)
{
    if (v->handle != 0 || v->maps != 0)
        return;
    for (struct vmm **p = &vmms; *p; p = &(*p)->next) {
        if (*p == v) {
            *p = v->next;
            break;
        }
    }
    close(v->fd);
    if (!v->imported)
        allocated -= v->size;
    free(v);
}

static int check_prop(const CUmemAllocationProp *prop)
{
    return prop && prop->type == CU_MEM_ALLOCATION_TYPE_PINNED &&
           prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE && prop->location.id >= 0 &&
           prop->location.id < DEVICES &&
           (prop->requestedHandleTypes == CU_MEM_HANDLE_TYPE_NONE ||
            prop->requestedHandleTypes == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
}

API CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                           int option)
{
    TRACE("cuMemGetAllocationGranularity(%d)", option);
    CUresult rc = need_init();
    if (rc)
        return rc;
    if (!granularity || !check_prop(prop) ||
        (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM && option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
        return CUDA_ERROR_INVALID_VALUE;
    *granularity = VMM_GRANULARITY;
    return CUDA_SUCCESS;
}

API CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                         const CUmemAllocationProp *prop, unsigned long long flags)
{
    TRACE("cuMemCreate(%zu)", size);
    CUresult rc = need_init();
    if (rc)
        return rc;
    if (!handle || size == 0 || size % VMM_GRANULARITY != 0 || flags != 0 || !check_prop(prop))
        return CUDA_ERROR_INVALID_VALUE;
    struct vmm *v = calloc(1, sizeof *v);
    if (!v)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&lock);
    if (allocated > memory_limit || size > memory_limit - allocated) {
        pthread_mutex_unlock(&lock);
        free(v);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    char name[96];
    snprintf(name, sizeof name, MEMFD_PREFIX ":%d:vmm-%llu:%d", (int)getpid(),
             (unsigned long long)next_gen++, prop->location.id);
    v->fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (v->fd < 0 || ftruncate(v->fd, (off_t)size) != 0 ||
        fcntl(v->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
        if (v->fd >= 0)
            close(v->fd);
        pthread_mutex_unlock(&lock);
        free(v);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    unsigned char *bytes = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, v->fd, 0);
    if (bytes != MAP_FAILED) {
        memset(bytes, POISON_FRESH, size);
        munmap(bytes, size);
    }
    v->size = size;
    v->device = prop->location.id;
    v->handle_types = prop->requestedHandleTypes;
    v->handle = next_vmm_handle++;
    v->next = vmms;
    vmms = v;
    allocated += size;
    *handle = v->handle;
    pthread_mutex_unlock(&lock);
    TRACE("cuMemCreate -> handle %llu", *handle);
    return CUDA_SUCCESS;
}

API CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    TRACE("cuMemRelease(%llu)", handle);
    CUresult rc = need_init();
    if (rc)
        return rc;
    pthread_mutex_lock(&lock);
    struct vmm *v = find_vmm(handle);
    if (v) {
        v->handle = 0;
        maybe_free_vmm(v);
    }
    pthread_mutex_unlock(&lock);
    return v ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

API CUresult cuMemExportToShareableHandle(void *shareable, CUmemGenericAllocationHandle handle,
                                          int handle_type, unsigned long long flags)
{
    TRACE("cuMemExportToShareableHandle(%llu, %d)", handle, handle_type);
    CUresult rc = need_init();
    if (rc)
        return rc;
    if (!shareable || flags != 0 || handle_type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct vmm *v = find_vmm(handle);
    int fd = -1;
    if (v && v->handle_types == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        fd = fcntl(v->fd, F_DUPFD_CLOEXEC, 0);
    pthread_mutex_unlock(&lock);
    if (fd < 0)
        return CUDA_ERROR_INVALID_VALUE;
    *(int *)shareable = fd;
    return CUDA_SUCCESS;
}

API CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *os_handle,
                                            int handle_type)
{
    int fd = (int)(intptr_t)os_handle;
    TRACE("cuMemImportFromShareableHandle(fd %d, %d)", fd, handle_type);
    CUresult rc = need_init();
    if (rc)
        return rc;
    if (!handle || handle_type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || fd < 0)
        return CUDA_ERROR_INVALID_VALUE;
    /* Only a memfd that cuMemCreate made (by its name) and sealed as it
     * seals them: a GPU driver's exported fd is its own kind of file too. */
    char path[64], link[256];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(path, link, sizeof link - 1);
    if (n < 0)
        return CUDA_ERROR_INVALID_HANDLE;
    link[n] = '\0';
    int pid, device, used = 0;
    unsigned long long gen;
    if (sscanf(link, "/memfd:" MEMFD_PREFIX ":%d:vmm-%llu:%d%n", &pid, &gen, &device, &used) != 3 ||
        (link[used] != '\0' && link[used] != ' ') || device < 0 || device >= DEVICES)
        return CUDA_ERROR_INVALID_HANDLE;
    struct stat st;
    int seals = fcntl(fd, F_GET_SEALS);
    int want = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0 ||
        (size_t)st.st_size % VMM_GRANULARITY != 0 || seals < 0 || (seals & want) != want)
        return CUDA_ERROR_INVALID_HANDLE;
    struct vmm *v = calloc(1, sizeof *v);
    if (!v)
        return CUDA_ERROR_OUT_OF_MEMORY;
    v->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (v->fd < 0) {
        free(v);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    v->size = (size_t)st.st_size;
    v->device = device;
    v->handle_types = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    v->imported = 1;
    pthread_mutex_lock(&lock);
    v->handle = next_vmm_handle++;
    v->next = vmms;
    vmms = v;
    *handle = v->handle;
    pthread_mutex_unlock(&lock);
    TRACE("cuMemImportFromShareableHandle -> handle %llu (%zu bytes)", *handle, v->size);
    return CUDA_SUCCESS;
}

API CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop,
                                                    CUmemGenericAllocationHandle handle)
{
    TRACE("cuMemGetAllocationPropertiesFromHandle(%llu)", handle);
    CUresult rc = need_init();
    if (rc)
        return rc;
    if (!prop)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct vmm *v = find_vmm(handle);
    if (v) {
        memset(prop, 0, sizeof *prop);
        prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop->requestedHandleTypes = v->handle_types;
        prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop->location.id = v->device;
    }
    pthread_mutex_unlock(&lock);
    return v ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

API CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                 unsigned long long flags)
{
    TRACE("cuMemAddressReserve(%zu)", size);
    CUresult rc = need_init();
    if (rc)
        return rc;
    if (!ptr || size == 0 || size % VMM_GRANULARITY != 0 || flags != 0 ||
        (alignment != 0 && alignment % (size_t)sysconf(_SC_PAGESIZE) != 0))
        return CUDA_ERROR_INVALID_VALUE;
    (void)addr; /* a hint */
    struct reservation *r = calloc(1, sizeof *r);
    if (!r)
        return CUDA_ERROR_OUT_OF_MEMORY;
    void *res = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (res == MAP_FAILED) {
        free(r);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    r->base = (uintptr_t)res;
    r->size = size;
    pthread_mutex_lock(&lock);
    r->next = reservations;
    reservations = r;
    pthread_mutex_unlock(&lock);
    *ptr = (CUdeviceptr)r->base;
    return CUDA_SUCCESS;
}

API CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    TRACE("cuMemAddressFree(%#llx, %zu)", ptr, size);
    CUresult rc = need_init();
    if (rc)
        return rc;
    pthread_mutex_lock(&lock);
    rc = CUDA_ERROR_INVALID_VALUE;
    for (struct reservation **p = &reservations; *p; p = &(*p)->next) {
        struct reservation *r = *p;
        if (r->base != ptr || r->size != size)
            continue;
        int mapped = 0;
        for (size_t i = 0; i < nblocks; i++)
            mapped |= blocks[i].vmm && blocks[i].dptr >= r->base && blocks[i].dptr - r->base < r->size;
        if (!mapped) {
            *p = r->next;
            munmap((void *)r->base, r->size);
            free(r);
            rc = CUDA_SUCCESS;
        }
        break;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

API CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                      unsigned long long flags)
{
    TRACE("cuMemMap(%#llx, %zu, %zu, %llu)", ptr, size, offset, handle);
    CUresult rc = need_init();
    if (rc)
        return rc;
    if (size == 0 || size % VMM_GRANULARITY != 0 || offset != 0 || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct vmm *v = find_vmm(handle);
    int in_reservation = 0;
    for (struct reservation *r = reservations; r; r = r->next)
        in_reservation |= ptr >= r->base && ptr - r->base <= r->size && size <= r->size - (ptr - r->base);
    int overlaps = 0;
    for (size_t i = 0; i < nblocks; i++)
        overlaps |= blocks[i].vmm && blocks[i].dptr < ptr + size && ptr < blocks[i].dptr + blocks[i].map_len;
    if (!v || size > v->size || !in_reservation || overlaps) {
        pthread_mutex_unlock(&lock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    struct block b = {.dptr = (uintptr_t)ptr,
                      .size = size,
                      .map_len = size,
                      .fd = -1,
                      .pid = getpid(),
                      .ctx = &contexts[v->device],
                      .vmm = v};
    void *bytes = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, v->fd, 0);
    if (bytes == MAP_FAILED) {
        pthread_mutex_unlock(&lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    b.bytes = bytes;
    if (add_block(&b) != 0) {
        munmap(bytes, size);
        pthread_mutex_unlock(&lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    v->maps++;
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

API CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
    TRACE("cuMemSetAccess(%#llx, %zu, %zu)", ptr, size, count);
    CUresult rc = need_init();
    if (rc)
        return rc;
    if (!desc || count == 0)
        return CUDA_ERROR_INVALID_VALUE;
    int grant = 0;
    for (size_t i = 0; i < count; i++) {
        if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || desc[i].location.id < 0 ||
            desc[i].location.id >= DEVICES)
            return CUDA_ERROR_INVALID_DEVICE;
        grant |= desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    }
    pthread_mutex_lock(&lock);
    /* The range must be exactly covered by mappings: one, here. */
    struct block *b = find((uintptr_t)ptr, size);
    rc = CUDA_ERROR_INVALID_VALUE;
    if (b && b->vmm) {
        b->access = grant;
        rc = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

API CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    TRACE("cuMemUnmap(%#llx, %zu)", ptr, size);
    CUresult rc = need_init();
    if (rc)
        return rc;
    pthread_mutex_lock(&lock);
    rc = CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < nblocks; i++) {
        struct block *b = &blocks[i];
        if (b->vmm && b->dptr == ptr && b->map_len == size) {
            struct vmm *v = b->vmm;
            drop_block(i);
            v->maps--;
            maybe_free_vmm(v);
            rc = CUDA_SUCCESS;
            break;
        }
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

API CUresult cuGetErrorString(CUresult error, const char **pstr)
{
    if (!pstr)
        return CUDA_ERROR_INVALID_VALUE;
    const char *s;
    switch (error) {
    case CUDA_SUCCESS: s = "no error"; break;
    case CUDA_ERROR_INVALID_VALUE: s = "invalid argument"; break;
    case CUDA_ERROR_OUT_OF_MEMORY: s = "out of memory"; break;
    case CUDA_ERROR_NOT_INITIALIZED: s = "initialization error"; break;
    case CUDA_ERROR_NO_DEVICE: s = "no CUDA-capable device is detected"; break;
    case CUDA_ERROR_INVALID_DEVICE: s = "invalid device ordinal"; break;
    case CUDA_ERROR_INVALID_CONTEXT: s = "invalid device context"; break;
    case CUDA_ERROR_MAP_FAILED: s = "mapping of buffer object failed"; break;
    case CUDA_ERROR_INVALID_HANDLE: s = "invalid resource handle"; break;
    case CUDA_ERROR_NOT_FOUND: s = "named symbol not found"; break;
    case CUDA_ERROR_NOT_SUPPORTED: s = "operation not supported"; break;
    case CUDA_ERROR_UNKNOWN: s = "unknown error"; break;
    default:
        *pstr = NULL;
        return CUDA_ERROR_INVALID_VALUE;
    }
    *pstr = s;
    return CUDA_SUCCESS;
}
