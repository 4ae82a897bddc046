/*
 * pp-launch's fake NVML: a libnvidia-ml.so.1 that serves a GPU inventory (docs/formats.md) through the real NVML C ABI.
 *
 * Built by the test set-up (pp_launch.testing.fake_nvml.build: gcc -shared -fPIC), never committed as a binary.
 * The structs, constants, error codes and versioned entry points below are those of nvml.h; only the calls
 * pp-launch's reader (and the stub stage, and nvidia-ml-py's init) make are served, everything else is absent
 * so that a caller sees NVML_ERROR_FUNCTION_NOT_FOUND exactly as with an old driver.
 *
 * Input: PP_FAKE_NVML_CONFIG names a file or a directory (every regular file in it, by name order, read as
 * one); default /etc/pp-fake-nvml. The text is written by pp_launch.testing.fake_nvml.config_text from an
 * inventory; its lines (keyword, then values):
 *
 *   driver V | cuda N               system fields (absent: not supported)
 *   fail TOKEN                      a failure switch, as in PP_FAKE_NVML_FAIL
 *   gpu UUID                        a new GPU; the lines after it describe it
 *   name TEXT | bus BUSID | util PCT | mig 0|1 | nvlinks N | link BUSID COUNT | topo UUID LEVEL
 *   migdev UUID                     a MIG device of the current GPU; memory/procs/proc after it are its own
 *   memory TOTAL_MIB USED_MIB       of the current GPU or MIG device
 *   procs                           the process list is known (each `proc PID USED_MIB|-` adds one)
 *   ecc N                           uncorrected volatile ECC errors of the current GPU (absent: not supported)
 *   retired_pending 0|1             retired pages pending a reset (absent: not supported)
 *   remap_failure 0|1               a row remapping failure occurred (absent: row remapping not supported)
 *   events PATH                     the Xid event file (also PP_FAKE_NVML_EVENTS)
 *
 * Events: an event set delivers, to nvmlEventSetWait, each `xid UUID CODE` line appended to the event file after
 * the set was created (as the driver delivers only what happens after registration), for a GPU registered for
 * nvmlEventTypeXidCriticalError; a test appends the line, the waiting reader gets it within ~10 ms.
 *
 * Failure switches (PP_FAKE_NVML_FAIL, space or comma separated, and `fail` lines):
 *   driver_not_loaded               nvmlInit* returns NVML_ERROR_DRIVER_NOT_LOADED
 *   lost:UUID                       every call on that GPU (and its MIG devices) returns NVML_ERROR_GPU_IS_LOST
 *   unsupported:FIELD               name|pci|memory|utilization|processes|mig|topology|nvlink|driver|cuda
 *                                   returns NVML_ERROR_NOT_SUPPORTED
 *   grow:N                          the process list grows by N between the size query and the read
 */
#include <ctype.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------------------------------- nvml.h, as is */
typedef enum nvmlReturn_enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_ALREADY_INITIALIZED = 5,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_INSUFFICIENT_POWER = 8,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_IRQ_ISSUE = 11,
    NVML_ERROR_LIBRARY_NOT_FOUND = 12,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_CORRUPTED_INFOROM = 14,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_RESET_REQUIRED = 16,
    NVML_ERROR_OPERATING_SYSTEM = 17,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
    NVML_ERROR_IN_USE = 19,
    NVML_ERROR_MEMORY = 20,
    NVML_ERROR_NO_DATA = 21,
    NVML_ERROR_VGPU_ECC_NOT_SUPPORTED = 22,
    NVML_ERROR_INSUFFICIENT_RESOURCES = 23,
    NVML_ERROR_FREQ_NOT_SUPPORTED = 24,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_DEPRECATED = 26,
    NVML_ERROR_NOT_READY = 27,
    NVML_ERROR_GPU_NOT_FOUND = 28,
    NVML_ERROR_INVALID_STATE = 29,
    NVML_ERROR_UNKNOWN = 999
} nvmlReturn_t;

typedef enum nvmlGpuLevel_enum {
    NVML_TOPOLOGY_INTERNAL = 0,
    NVML_TOPOLOGY_SINGLE = 10,
    NVML_TOPOLOGY_MULTIPLE = 20,
    NVML_TOPOLOGY_HOSTBRIDGE = 30,
    NVML_TOPOLOGY_NODE = 40,
    NVML_TOPOLOGY_SYSTEM = 50
} nvmlGpuTopologyLevel_t;

typedef enum nvmlEnableState_enum { NVML_FEATURE_DISABLED = 0, NVML_FEATURE_ENABLED = 1 } nvmlEnableState_t;

#define NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE 32
#define NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE 16
#define NVML_DEVICE_UUID_V2_BUFFER_SIZE 96
#define NVML_DEVICE_NAME_V2_BUFFER_SIZE 96
#define NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE 80
#define NVML_NVLINK_MAX_LINKS 18
#define NVML_DEVICE_MIG_DISABLE 0
#define NVML_DEVICE_MIG_ENABLE 1
#define NVML_STRUCT_VERSION(data, ver) (unsigned int)(sizeof(nvml##data##_v##ver##_t) | (ver << 24U))

typedef struct nvmlDevice_st *nvmlDevice_t;

typedef struct nvmlPciInfo_st {
    char busIdLegacy[NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
} nvmlPciInfo_t;

typedef struct nvmlMemory_st {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

typedef struct nvmlMemory_v2_st {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;
#define nvmlMemory_v2 NVML_STRUCT_VERSION(Memory, 2)

typedef struct nvmlUtilization_st {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;

typedef struct nvmlProcessInfo_st {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_t;

#define NVML_VALUE_NOT_AVAILABLE_ULL 0xFFFFFFFFFFFFFFFFULL

typedef enum nvmlMemoryErrorType_enum {
    NVML_MEMORY_ERROR_TYPE_CORRECTED = 0,
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
} nvmlMemoryErrorType_t;

typedef enum nvmlEccCounterType_enum { NVML_VOLATILE_ECC = 0, NVML_AGGREGATE_ECC = 1 } nvmlEccCounterType_t;

#define nvmlEventTypeXidCriticalError 0x0000000000000008LL

typedef struct nvmlEventSet_st *nvmlEventSet_t;

typedef struct nvmlEventData_st {
    nvmlDevice_t device;
    unsigned long long eventType;
    unsigned long long eventData;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlEventData_t;

_Static_assert(sizeof(nvmlEventData_t) == 32, "nvmlEventData_t layout");

_Static_assert(sizeof(nvmlPciInfo_t) == 68, "nvmlPciInfo_t layout");
_Static_assert(sizeof(nvmlMemory_v2_t) == 40, "nvmlMemory_v2_t layout");
_Static_assert(nvmlMemory_v2 == 0x02000028, "nvmlMemory_v2 version");
_Static_assert(sizeof(nvmlProcessInfo_t) == 24, "nvmlProcessInfo_t layout");

/* ------------------------------------------------------------------------------------------ the model */
#define API __attribute__((visibility("default")))
#define MAX_GPUS 64
#define MAX_MIG 8
#define MAX_PROCS 128
#define MIB (1024ULL * 1024ULL)
#define MAGIC 0x4e564d4c /* "NVML" */

typedef struct {
    unsigned int pid;
    long long used_mib; /* -1: not available */
} proc_t;

typedef struct nvmlDevice_st {
    unsigned int magic;
    int is_mig;
    int gpu; /* index of the GPU (for a MIG device: its parent) */
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    long long total_mib, used_mib; /* -1: unknown */
    int procs_known;
    int nprocs;
    proc_t procs[MAX_PROCS];
} dev_t_;

typedef struct {
    dev_t_ dev;
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    char bus[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
    int util; /* -1: unknown */
    int temp; /* degrees C; -1: unknown */
    long long power_mw, power_limit_mw; /* -1: unknown */
    long long ecc_unc;  /* uncorrected volatile ECC errors; -1: not supported */
    int retired_pending; /* -1: not supported */
    int remap_failure;   /* -1: not supported */
    int mig;  /* -1: unknown, 0, 1 */
    int nmig;
    dev_t_ migs[MAX_MIG];
    int ntopo;
    char topo_uuid[MAX_GPUS][NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    int topo_level[MAX_GPUS];
    int nvlinks; /* links this GPU reports; 0: NVLink not supported */
    int nlinkto;
    char link_bus[NVML_NVLINK_MAX_LINKS][NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
    int link_count[NVML_NVLINK_MAX_LINKS];
} gpu_t;

static gpu_t g_gpus[MAX_GPUS];
static int g_ngpus;
static char g_driver[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE];
static int g_has_driver;
static int g_cuda = -1;
static int g_init_count;
static char g_events[4096]; /* the Xid event file ("": none) */

/* failure switches */
static int f_driver_not_loaded;
static char f_lost[MAX_GPUS][NVML_DEVICE_UUID_V2_BUFFER_SIZE];
static int f_nlost;
static unsigned f_unsupported; /* bit per field */
static int f_grow;

enum { U_NAME = 1, U_PCI = 2, U_MEMORY = 4, U_UTIL = 8, U_PROCS = 16, U_MIG = 32, U_TOPO = 64, U_NVLINK = 128,
       U_DRIVER = 256, U_CUDA = 512, U_TEMP = 1024, U_POWER = 2048 };

static void copy(char *dst, size_t size, const char *src) {
    snprintf(dst, size, "%s", src);
}

static void fail_token(const char *tok) {
    static const struct { const char *name; unsigned bit; } fields[] = {
        {"name", U_NAME}, {"pci", U_PCI}, {"memory", U_MEMORY}, {"utilization", U_UTIL}, {"processes", U_PROCS},
        {"mig", U_MIG}, {"topology", U_TOPO}, {"nvlink", U_NVLINK}, {"driver", U_DRIVER}, {"cuda", U_CUDA},
        {"temperature", U_TEMP}, {"power", U_POWER}};
    if (strcmp(tok, "driver_not_loaded") == 0) {
        f_driver_not_loaded = 1;
    } else if (strncmp(tok, "lost:", 5) == 0 && f_nlost < MAX_GPUS) {
        copy(f_lost[f_nlost++], NVML_DEVICE_UUID_V2_BUFFER_SIZE, tok + 5);
    } else if (strncmp(tok, "grow:", 5) == 0) {
        f_grow = atoi(tok + 5);
    } else if (strncmp(tok, "unsupported:", 12) == 0) {
        for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
            if (strcmp(tok + 12, fields[i].name) == 0) f_unsupported |= fields[i].bit;
    }
}

static void fail_list(const char *text) {
    char buf[4096];
    copy(buf, sizeof buf, text);
    for (char *save = NULL, *tok = strtok_r(buf, " ,\t\n", &save); tok; tok = strtok_r(NULL, " ,\t\n", &save))
        fail_token(tok);
}

static long long num_or_unknown(const char *s) {
    return (s == NULL || strcmp(s, "-") == 0) ? -1 : atoll(s);
}

static void parse_line(char *line, dev_t_ **cur) {
    size_t n = strlen(line);
    while (n && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
    char *key = line;
    while (*key == ' ') key++;
    if (*key == 0 || *key == '#') return;
    char *rest = strchr(key, ' ');
    if (rest) *rest++ = 0; else rest = key + strlen(key);
    gpu_t *g = g_ngpus ? &g_gpus[g_ngpus - 1] : NULL;
    char *a = NULL, *b = NULL, *save = NULL, tmp[256];
    copy(tmp, sizeof tmp, rest);
    a = strtok_r(tmp, " ", &save);
    if (a) b = strtok_r(NULL, " ", &save);

    if (strcmp(key, "driver") == 0) { copy(g_driver, sizeof g_driver, rest); g_has_driver = 1; return; }
    if (strcmp(key, "cuda") == 0) { g_cuda = atoi(rest); return; }
    if (strcmp(key, "fail") == 0) { fail_list(rest); return; }
    if (strcmp(key, "events") == 0) { copy(g_events, sizeof g_events, rest); return; }
    if (strcmp(key, "gpu") == 0 && g_ngpus < MAX_GPUS) {
        g = &g_gpus[g_ngpus];
        memset(g, 0, sizeof *g);
        g->dev.magic = MAGIC;
        g->dev.gpu = g_ngpus++;
        copy(g->dev.uuid, sizeof g->dev.uuid, rest);
        g->dev.total_mib = g->dev.used_mib = -1;
        g->util = g->mig = g->temp = -1;
        g->power_mw = g->power_limit_mw = -1;
        g->ecc_unc = -1;
        g->retired_pending = g->remap_failure = -1;
        *cur = &g->dev;
        return;
    }
    if (g == NULL) return;
    if (strcmp(key, "name") == 0) copy(g->name, sizeof g->name, rest);
    else if (strcmp(key, "bus") == 0) copy(g->bus, sizeof g->bus, rest);
    else if (strcmp(key, "util") == 0) g->util = (int)num_or_unknown(a);
    else if (strcmp(key, "temp") == 0) g->temp = (int)num_or_unknown(a);
    else if (strcmp(key, "power") == 0) { g->power_mw = num_or_unknown(a); g->power_limit_mw = num_or_unknown(b); }
    else if (strcmp(key, "ecc") == 0) g->ecc_unc = num_or_unknown(a);
    else if (strcmp(key, "retired_pending") == 0) g->retired_pending = (int)num_or_unknown(a);
    else if (strcmp(key, "remap_failure") == 0) g->remap_failure = (int)num_or_unknown(a);
    else if (strcmp(key, "mig") == 0) g->mig = atoi(rest);
    else if (strcmp(key, "nvlinks") == 0) g->nvlinks = atoi(rest);
    else if (strcmp(key, "link") == 0 && a && b && g->nlinkto < NVML_NVLINK_MAX_LINKS) {
        copy(g->link_bus[g->nlinkto], NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE, a);
        g->link_count[g->nlinkto++] = atoi(b);
    } else if (strcmp(key, "topo") == 0 && a && b && g->ntopo < MAX_GPUS) {
        copy(g->topo_uuid[g->ntopo], NVML_DEVICE_UUID_V2_BUFFER_SIZE, a);
        g->topo_level[g->ntopo++] = atoi(b);
    } else if (strcmp(key, "migdev") == 0 && g->nmig < MAX_MIG) {
        dev_t_ *m = &g->migs[g->nmig++];
        memset(m, 0, sizeof *m);
        m->magic = MAGIC;
        m->is_mig = 1;
        m->gpu = g->dev.gpu;
        copy(m->uuid, sizeof m->uuid, rest);
        m->total_mib = m->used_mib = -1;
        *cur = m;
    } else if (strcmp(key, "memory") == 0 && *cur) {
        (*cur)->total_mib = num_or_unknown(a);
        (*cur)->used_mib = num_or_unknown(b);
    } else if (strcmp(key, "procs") == 0 && *cur) {
        (*cur)->procs_known = 1;
    } else if (strcmp(key, "proc") == 0 && *cur && a && (*cur)->nprocs < MAX_PROCS) {
        proc_t *p = &(*cur)->procs[(*cur)->nprocs++];
        p->pid = (unsigned)atoll(a);
        p->used_mib = num_or_unknown(b);
    }
}

static int read_file(const char *path, dev_t_ **cur) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[512];
    while (fgets(line, sizeof line, f)) parse_line(line, cur);
    fclose(f);
    return 1;
}

static int by_name(const struct dirent **a, const struct dirent **b) {
    return strcmp((*a)->d_name, (*b)->d_name);
}

static int load(void) {
    g_ngpus = 0;
    g_has_driver = 0;
    g_cuda = -1;
    g_events[0] = 0;
    f_driver_not_loaded = f_nlost = f_grow = 0;
    f_unsupported = 0;
    const char *path = getenv("PP_FAKE_NVML_CONFIG");
    if (!path || !*path) path = "/etc/pp-fake-nvml";
    dev_t_ *cur = NULL;
    struct stat st;
    if (stat(path, &st) != 0) return 0;
    if (S_ISDIR(st.st_mode)) {
        struct dirent **names;
        int n = scandir(path, &names, NULL, by_name);
        if (n < 0) return 0;
        for (int i = 0; i < n; i++) {
            char full[4096];
            struct stat fs;
            snprintf(full, sizeof full, "%s/%s", path, names[i]->d_name);
            if (names[i]->d_name[0] != '.' && stat(full, &fs) == 0 && S_ISREG(fs.st_mode)) read_file(full, &cur);
            free(names[i]);
        }
        free(names);
    } else if (!read_file(path, &cur)) {
        return 0;
    }
    const char *env = getenv("PP_FAKE_NVML_FAIL");
    if (env) fail_list(env);
    const char *events = getenv("PP_FAKE_NVML_EVENTS");
    if (events && *events) copy(g_events, sizeof g_events, events);
    return 1;
}

/* ----------------------------------------------------------------------------------------- helpers */
static int is_lost(int gpu) {
    for (int i = 0; i < f_nlost; i++)
        if (strcmp(f_lost[i], g_gpus[gpu].dev.uuid) == 0) return 1;
    return 0;
}

/* Validate a handle: initialised, ours, not on a lost GPU. */
static nvmlReturn_t check(nvmlDevice_t d) {
    if (g_init_count == 0) return NVML_ERROR_UNINITIALIZED;
    if (d == NULL || d->magic != MAGIC) return NVML_ERROR_INVALID_ARGUMENT;
    if (is_lost(d->gpu)) return NVML_ERROR_GPU_IS_LOST;
    return NVML_SUCCESS;
}

#define CHECK(d)                                \
    do {                                        \
        nvmlReturn_t _r = check(d);             \
        if (_r != NVML_SUCCESS) return _r;      \
    } while (0)

static nvmlReturn_t put_string(char *dst, unsigned int length, const char *src) {
    if (dst == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, strlen(src) + 1);
    return NVML_SUCCESS;
}

static void fill_pci(nvmlPciInfo_t *pci, const char *bus_id) {
    memset(pci, 0, sizeof *pci);
    copy(pci->busId, sizeof pci->busId, bus_id);
    unsigned dom = 0, bus = 0, dev = 0, fn = 0;
    sscanf(bus_id, "%x:%x:%x.%x", &dom, &bus, &dev, &fn);
    pci->domain = dom;
    pci->bus = bus;
    pci->device = dev;
    pci->pciDeviceId = 0x233510DE; /* an H200's device id, NVIDIA's vendor id */
    pci->pciSubSystemId = 0x18D410DE;
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.%X", dom & 0xFFFF, bus, dev, fn);
}

/* -------------------------------------------------------------------------------------- the calls */
API nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    if (g_init_count == 0 && !load()) return NVML_ERROR_DRIVER_NOT_LOADED;
    if (f_driver_not_loaded) return NVML_ERROR_DRIVER_NOT_LOADED;
    g_init_count++;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
API nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

API nvmlReturn_t nvmlShutdown(void) {
    if (g_init_count == 0) return NVML_ERROR_UNINITIALIZED;
    g_init_count--;
    return NVML_SUCCESS;
}

API const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    default: return "Unknown Error";
    }
}

API nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    if (g_init_count == 0) return NVML_ERROR_UNINITIALIZED;
    if (!g_has_driver || (f_unsupported & U_DRIVER)) return NVML_ERROR_NOT_SUPPORTED;
    return put_string(version, length, g_driver);
}

API nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    if (g_init_count == 0) return NVML_ERROR_UNINITIALIZED;
    return put_string(version, length, g_has_driver ? g_driver : "0.0");
}

API nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion) {
    if (g_init_count == 0) return NVML_ERROR_UNINITIALIZED;
    if (cudaDriverVersion == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (g_cuda < 0 || (f_unsupported & U_CUDA)) return NVML_ERROR_NOT_SUPPORTED;
    *cudaDriverVersion = g_cuda;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) { return nvmlSystemGetCudaDriverVersion_v2(v); }

API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount) {
    if (g_init_count == 0) return NVML_ERROR_UNINITIALIZED;
    if (deviceCount == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *deviceCount = (unsigned)g_ngpus;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetCount(unsigned int *n) { return nvmlDeviceGetCount_v2(n); }

API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (g_init_count == 0) return NVML_ERROR_UNINITIALIZED;
    if (device == NULL || index >= (unsigned)g_ngpus) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &g_gpus[index].dev;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int i, nvmlDevice_t *d) {
    return nvmlDeviceGetHandleByIndex_v2(i, d);
}

API nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    if (g_init_count == 0) return NVML_ERROR_UNINITIALIZED;
    if (uuid == NULL || device == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < g_ngpus; i++) {
        if (strcmp(g_gpus[i].dev.uuid, uuid) == 0) {
            if (is_lost(i)) return NVML_ERROR_GPU_IS_LOST;
            *device = &g_gpus[i].dev;
            return NVML_SUCCESS;
        }
        for (int m = 0; m < g_gpus[i].nmig; m++)
            if (strcmp(g_gpus[i].migs[m].uuid, uuid) == 0) {
                *device = &g_gpus[i].migs[m];
                return NVML_SUCCESS;
            }
    }
    return NVML_ERROR_NOT_FOUND;
}

API nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device) {
    if (g_init_count == 0) return NVML_ERROR_UNINITIALIZED;
    if (pciBusId == NULL || device == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < g_ngpus; i++)
        if (g_gpus[i].bus[0] && strcasecmp(g_gpus[i].bus, pciBusId) == 0) {
            *device = &g_gpus[i].dev;
            return NVML_SUCCESS;
        }
    return NVML_ERROR_NOT_FOUND;
}

API nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    CHECK(device);
    if (index == NULL || device->is_mig) return NVML_ERROR_INVALID_ARGUMENT;
    *index = (unsigned)device->gpu;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    CHECK(device);
    if (f_unsupported & U_NAME) return NVML_ERROR_NOT_SUPPORTED;
    return put_string(name, length, g_gpus[device->gpu].name);
}

API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    CHECK(device);
    return put_string(uuid, length, device->uuid);
}

API nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    CHECK(device);
    if (pci == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if ((f_unsupported & U_PCI) || g_gpus[device->gpu].bus[0] == 0) return NVML_ERROR_NOT_SUPPORTED;
    fill_pci(pci, g_gpus[device->gpu].bus);
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t d, nvmlPciInfo_t *p) { return nvmlDeviceGetPciInfo_v3(d, p); }
API nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t d, nvmlPciInfo_t *p) { return nvmlDeviceGetPciInfo_v3(d, p); }

static nvmlReturn_t memory_of(nvmlDevice_t device, unsigned long long *total, unsigned long long *used) {
    CHECK(device);
    if ((f_unsupported & U_MEMORY) || device->total_mib < 0 || device->used_mib < 0) return NVML_ERROR_NOT_SUPPORTED;
    *total = (unsigned long long)device->total_mib * MIB;
    *used = (unsigned long long)device->used_mib * MIB;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    if (memory == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned long long total, used;
    nvmlReturn_t r = memory_of(device, &total, &used);
    if (r != NVML_SUCCESS) return r;
    memory->total = total;
    memory->used = used;
    memory->free = total - used;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    if (memory == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (memory->version != nvmlMemory_v2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    unsigned long long total, used;
    nvmlReturn_t r = memory_of(device, &total, &used);
    if (r != NVML_SUCCESS) return r;
    memory->total = total;
    memory->reserved = 0;
    memory->used = used;
    memory->free = total - used;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization) {
    CHECK(device);
    if (utilization == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (device->is_mig || (f_unsupported & U_UTIL) || g_gpus[device->gpu].util < 0) return NVML_ERROR_NOT_SUPPORTED;
    utilization->gpu = (unsigned)g_gpus[device->gpu].util;
    utilization->memory = 0;
    return NVML_SUCCESS;
}

/* nvml.h: nvmlDeviceGetTemperature(device, NVML_TEMPERATURE_GPU (0), unsigned int *temp), degrees C. */
API nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, int sensorType, unsigned int *temp) {
    CHECK(device);
    if (temp == NULL || sensorType != 0) return NVML_ERROR_INVALID_ARGUMENT;
    if (device->is_mig || (f_unsupported & U_TEMP) || g_gpus[device->gpu].temp < 0) return NVML_ERROR_NOT_SUPPORTED;
    *temp = (unsigned)g_gpus[device->gpu].temp;
    return NVML_SUCCESS;
}

/* nvml.h: nvmlDeviceGetPowerUsage(device, unsigned int *power), milliwatts drawn now. */
API nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power) {
    CHECK(device);
    if (power == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (device->is_mig || (f_unsupported & U_POWER) || g_gpus[device->gpu].power_mw < 0) return NVML_ERROR_NOT_SUPPORTED;
    *power = (unsigned)g_gpus[device->gpu].power_mw;
    return NVML_SUCCESS;
}

/* nvml.h: nvmlDeviceGetEnforcedPowerLimit(device, unsigned int *limit), milliwatts. */
API nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *limit) {
    CHECK(device);
    if (limit == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (device->is_mig || (f_unsupported & U_POWER) || g_gpus[device->gpu].power_limit_mw < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    *limit = (unsigned)g_gpus[device->gpu].power_limit_mw;
    return NVML_SUCCESS;
}

/* Size query (infos NULL or *infoCount too small): NVML_ERROR_INSUFFICIENT_SIZE with the count needed; a list
 * that grows (fail grow:N) has N more entries at the read than the size query announced. */
API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                         nvmlProcessInfo_t *infos) {
    CHECK(device);
    if (infoCount == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if ((f_unsupported & U_PROCS) || !device->procs_known) return NVML_ERROR_NOT_SUPPORTED;
    unsigned int have = (unsigned)device->nprocs;
    if (infos == NULL || *infoCount == 0) {
        *infoCount = have;
        return have == 0 ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE;
    }
    unsigned int now = have + (unsigned)(f_grow > 0 ? f_grow : 0);
    if (*infoCount < now) {
        *infoCount = now;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned int i = 0; i < now; i++) {
        memset(&infos[i], 0, sizeof infos[i]);
        if (i < have) {
            infos[i].pid = device->procs[i].pid;
            infos[i].usedGpuMemory = device->procs[i].used_mib < 0 ? NVML_VALUE_NOT_AVAILABLE_ULL
                                                                   : (unsigned long long)device->procs[i].used_mib * MIB;
        } else {
            infos[i].pid = 90000 + i; /* a process that started between the two calls */
            infos[i].usedGpuMemory = MIB;
        }
        infos[i].gpuInstanceId = infos[i].computeInstanceId = 0xFFFFFFFF;
    }
    *infoCount = now;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int *n, nvmlProcessInfo_t *p) {
    return nvmlDeviceGetComputeRunningProcesses_v3(d, n, p);
}

API nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode, unsigned int *pendingMode) {
    CHECK(device);
    if (currentMode == NULL || pendingMode == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (device->is_mig || (f_unsupported & U_MIG) || g_gpus[device->gpu].mig < 0) return NVML_ERROR_NOT_SUPPORTED;
    *currentMode = *pendingMode = g_gpus[device->gpu].mig ? NVML_DEVICE_MIG_ENABLE : NVML_DEVICE_MIG_DISABLE;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count) {
    CHECK(device);
    if (count == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (device->is_mig || (f_unsupported & U_MIG) || g_gpus[device->gpu].mig < 0) return NVML_ERROR_NOT_SUPPORTED;
    *count = g_gpus[device->gpu].nmig > 7 ? (unsigned)g_gpus[device->gpu].nmig : 7;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                     nvmlDevice_t *migDevice) {
    CHECK(device);
    if (migDevice == NULL || device->is_mig) return NVML_ERROR_INVALID_ARGUMENT;
    gpu_t *g = &g_gpus[device->gpu];
    if (g->mig != 1) return NVML_ERROR_INVALID_ARGUMENT;
    if (index >= (unsigned)g->nmig) return NVML_ERROR_NOT_FOUND;
    *migDevice = &g->migs[index];
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice) {
    CHECK(device);
    if (isMigDevice == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *isMigDevice = (unsigned)device->is_mig;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice, nvmlDevice_t *device) {
    CHECK(migDevice);
    if (device == NULL || !migDevice->is_mig) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &g_gpus[migDevice->gpu].dev;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t device1, nvmlDevice_t device2,
                                                     nvmlGpuTopologyLevel_t *pathInfo) {
    CHECK(device1);
    CHECK(device2);
    if (pathInfo == NULL || device1->is_mig || device2->is_mig) return NVML_ERROR_INVALID_ARGUMENT;
    if (f_unsupported & U_TOPO) return NVML_ERROR_NOT_SUPPORTED;
    if (device1 == device2) {
        *pathInfo = NVML_TOPOLOGY_INTERNAL;
        return NVML_SUCCESS;
    }
    gpu_t *g = &g_gpus[device1->gpu];
    for (int i = 0; i < g->ntopo; i++)
        if (strcmp(g->topo_uuid[i], device2->uuid) == 0) {
            *pathInfo = (nvmlGpuTopologyLevel_t)g->topo_level[i];
            return NVML_SUCCESS;
        }
    return NVML_ERROR_NOT_SUPPORTED;
}

/* Link k of a GPU: the first links (in `link` line order) are active towards their peer's bus, the rest of its
 * `nvlinks` are inactive; beyond them, or on a GPU without NVLink, NVML says not supported / invalid. */
static const char *link_peer(gpu_t *g, unsigned int link) {
    unsigned int k = 0;
    for (int i = 0; i < g->nlinkto; i++)
        for (int c = 0; c < g->link_count[i]; c++, k++)
            if (k == link) return g->link_bus[i];
    return NULL;
}

API nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, nvmlEnableState_t *isActive) {
    CHECK(device);
    if (isActive == NULL || device->is_mig) return NVML_ERROR_INVALID_ARGUMENT;
    gpu_t *g = &g_gpus[device->gpu];
    if ((f_unsupported & U_NVLINK) || g->nvlinks == 0) return NVML_ERROR_NOT_SUPPORTED;
    if (link >= (unsigned)g->nvlinks || link >= NVML_NVLINK_MAX_LINKS) return NVML_ERROR_INVALID_ARGUMENT;
    *isActive = link_peer(g, link) ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link, nvmlPciInfo_t *pci) {
    CHECK(device);
    if (pci == NULL || device->is_mig) return NVML_ERROR_INVALID_ARGUMENT;
    gpu_t *g = &g_gpus[device->gpu];
    if ((f_unsupported & U_NVLINK) || g->nvlinks == 0) return NVML_ERROR_NOT_SUPPORTED;
    if (link >= (unsigned)g->nvlinks || link >= NVML_NVLINK_MAX_LINKS) return NVML_ERROR_INVALID_ARGUMENT;
    const char *peer = link_peer(g, link);
    if (peer == NULL) return NVML_ERROR_NOT_SUPPORTED; /* an inactive link has no remote end */
    fill_pci(pci, peer);
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------------------------------ health */
API nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, nvmlMemoryErrorType_t errorType,
                                             nvmlEccCounterType_t counterType, unsigned long long *eccCounts) {
    CHECK(device);
    (void)counterType; /* the fake keeps one count: volatile and aggregate read the same */
    if (eccCounts == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    gpu_t *g = &g_gpus[device->gpu];
    if (device->is_mig || g->ecc_unc < 0) return NVML_ERROR_NOT_SUPPORTED;
    *eccCounts = errorType == NVML_MEMORY_ERROR_TYPE_UNCORRECTED ? (unsigned long long)g->ecc_unc : 0ULL;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device, nvmlEnableState_t *isPending) {
    CHECK(device);
    if (isPending == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    gpu_t *g = &g_gpus[device->gpu];
    if (device->is_mig || g->retired_pending < 0) return NVML_ERROR_NOT_SUPPORTED;
    *isPending = g->retired_pending ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows, unsigned int *uncRows,
                                           unsigned int *isPending, unsigned int *failureOccurred) {
    CHECK(device);
    if (!corrRows || !uncRows || !isPending || !failureOccurred) return NVML_ERROR_INVALID_ARGUMENT;
    gpu_t *g = &g_gpus[device->gpu];
    if (device->is_mig || g->remap_failure < 0) return NVML_ERROR_NOT_SUPPORTED;
    *corrRows = *uncRows = *isPending = 0;
    *failureOccurred = (unsigned int)g->remap_failure;
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------------------------------ events */
#define SET_MAGIC 0x45564e54 /* "EVNT" */

struct nvmlEventSet_st {
    unsigned int magic;
    long offset; /* how far into the event file this set has read */
    int ndev;
    nvmlDevice_t devs[MAX_GPUS];
    unsigned long long types[MAX_GPUS];
};

static long file_size(const char *path) {
    struct stat st;
    return (path[0] && stat(path, &st) == 0) ? (long)st.st_size : 0;
}

API nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    if (g_init_count == 0) return NVML_ERROR_UNINITIALIZED;
    if (set == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    struct nvmlEventSet_st *s = calloc(1, sizeof *s);
    if (s == NULL) return NVML_ERROR_MEMORY;
    s->magic = SET_MAGIC;
    s->offset = file_size(g_events); /* only what happens from now on */
    *set = s;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *eventTypes) {
    CHECK(device);
    if (eventTypes == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *eventTypes = nvmlEventTypeXidCriticalError;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes, nvmlEventSet_t set) {
    CHECK(device);
    if (set == NULL || set->magic != SET_MAGIC) return NVML_ERROR_INVALID_ARGUMENT;
    if (eventTypes & ~(unsigned long long)nvmlEventTypeXidCriticalError) return NVML_ERROR_NOT_SUPPORTED;
    if (set->ndev >= MAX_GPUS) return NVML_ERROR_INSUFFICIENT_SIZE;
    set->devs[set->ndev] = device;
    set->types[set->ndev++] = eventTypes;
    return NVML_SUCCESS;
}

/* The next `xid UUID CODE` line past the set's offset for a registered GPU: 1 (data filled), else 0. */
static int next_event(nvmlEventSet_t set, nvmlEventData_t *data) {
    FILE *f = g_events[0] ? fopen(g_events, "r") : NULL;
    if (f == NULL) return 0;
    int found = 0;
    char line[512];
    if (fseek(f, set->offset, SEEK_SET) == 0) {
        while (!found && fgets(line, sizeof line, f)) {
            size_t n = strlen(line);
            if (n == 0 || line[n - 1] != '\n') break; /* a line still being written: read it whole next time */
            set->offset += (long)n;
            char kind[16], uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
            unsigned long long code;
            if (sscanf(line, "%15s %95s %llu", kind, uuid, &code) != 3 || strcmp(kind, "xid") != 0) continue;
            for (int i = 0; i < set->ndev; i++) {
                if (strcmp(set->devs[i]->uuid, uuid) != 0) continue;
                if (!(set->types[i] & (unsigned long long)nvmlEventTypeXidCriticalError)) continue;
                memset(data, 0, sizeof *data);
                data->device = set->devs[i];
                data->eventType = nvmlEventTypeXidCriticalError;
                data->eventData = code;
                data->gpuInstanceId = data->computeInstanceId = 0xFFFFFFFFu;
                found = 1;
                break;
            }
        }
    }
    fclose(f);
    return found;
}

API nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    if (g_init_count == 0) return NVML_ERROR_UNINITIALIZED;
    if (set == NULL || set->magic != SET_MAGIC || data == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    struct timespec start, now, tick = {0, 10 * 1000 * 1000};
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (;;) {
        if (next_event(set, data)) return NVML_SUCCESS;
        clock_gettime(CLOCK_MONOTONIC, &now);
        long long waited = (now.tv_sec - start.tv_sec) * 1000LL + (now.tv_nsec - start.tv_nsec) / 1000000LL;
        if (waited >= (long long)timeoutms) return NVML_ERROR_TIMEOUT;
        nanosleep(&tick, NULL);
    }
}

API nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    return nvmlEventSetWait_v2(set, data, timeoutms);
}

API nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    if (set == NULL || set->magic != SET_MAGIC) return NVML_ERROR_INVALID_ARGUMENT;
    set->magic = 0;
    free(set);
    return NVML_SUCCESS;
}
