/*
 * A simulated libnvidia-ml.so.1 for the simulated GPU node (hack/testbed/nvmlsim.py).
 *
 * It exports only the NVML entry points engine/nvml.py calls, with the real ABI of
 * nvml.h (int return codes, opaque device handles, unsigned int out-parameters), and
 * answers from a description file next to itself: "<its folder>/nvml-sim.txt", found
 * through dladdr. Lines (fields separated by single spaces; '#' starts a comment line):
 *
 *   init <rc> <sleep_ms>                      what nvmlInit_v2 returns, after sleeping
 *   gpu <uuid> <minor> <mig current> <mig pending> <max mig devices>
 *                                             one GPU; its index is its position;
 *                                             mig -1 -1: NOT_SUPPORTED
 *   mig <gpu index> <j> <uuid> <gi> <ci>      one MIG device at raw index j
 *
 * No description (a container that got the library without it): nvmlInit_v2 returns
 * 9, Driver Not Loaded, as the real library does without a kernel driver.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define API __attribute__((visibility("default")))

enum { OK = 0, UNINITIALIZED = 1, INVALID_ARGUMENT = 2, NOT_SUPPORTED = 3, NOT_FOUND = 6,
       INSUFFICIENT_SIZE = 7, DRIVER_NOT_LOADED = 9, UNKNOWN = 999 };
enum { MAX_GPUS = 32, MAX_MIG = 64, UUID_LEN = 96 };

struct device {
    int is_mig;
    char uuid[UUID_LEN];
    unsigned minor, mig_current, mig_pending, max_mig, gi, ci;
    int mig_supported;
    struct device *mig[MAX_MIG]; /* by raw index j; NULL: no device there */
};

static struct device gpus[MAX_GPUS];
static struct device migs[MAX_GPUS * MAX_MIG];
static unsigned gpu_count, mig_count;
static int initialized;

static int load(void)
{
    Dl_info info;
    char path[4096 + 32], line[512];
    int rc = OK;
    unsigned sleep_ms = 0;
    if (!dladdr((void *)load, &info) || !info.dli_fname)
        return UNKNOWN;
    snprintf(path, sizeof path, "%s", info.dli_fname);
    char folder[4096];
    snprintf(folder, sizeof folder, "%s", dirname(path));
    snprintf(path, sizeof path, "%s/nvml-sim.txt", folder);
    FILE *f = fopen(path, "re");
    if (!f)
        return DRIVER_NOT_LOADED;
    memset(gpus, 0, sizeof gpus);
    memset(migs, 0, sizeof migs);
    gpu_count = mig_count = 0;
    while (fgets(line, sizeof line, f)) {
        char uuid[UUID_LEN];
        int cur, pend;
        unsigned a, b, c, d;
        if (line[0] == '#' || line[0] == '\n')
            continue;
        if (sscanf(line, "init %d %u", &rc, &sleep_ms) == 2)
            continue;
        if (sscanf(line, "gpu %95s %u %d %d %u", uuid, &a, &cur, &pend, &b) == 5 && gpu_count < MAX_GPUS) {
            struct device *g = &gpus[gpu_count++];
            snprintf(g->uuid, UUID_LEN, "%s", uuid);
            g->minor = a;
            g->mig_supported = cur >= 0;
            g->mig_current = cur > 0;
            g->mig_pending = pend > 0;
            g->max_mig = b < MAX_MIG ? b : MAX_MIG;
            continue;
        }
        if (sscanf(line, "mig %u %u %95s %u %u", &a, &b, uuid, &c, &d) == 5 && a < gpu_count && b < MAX_MIG
            && mig_count < MAX_GPUS * MAX_MIG) {
            struct device *m = &migs[mig_count++];
            m->is_mig = 1;
            snprintf(m->uuid, UUID_LEN, "%s", uuid);
            m->minor = gpus[a].minor;
            m->gi = c;
            m->ci = d;
            gpus[a].mig[b] = m;
            continue;
        }
        fclose(f);
        return UNKNOWN; /* a line this file does not know: the test bed wrote it wrong */
    }
    fclose(f);
    if (sleep_ms) {
        struct timespec ts = { sleep_ms / 1000, (long)(sleep_ms % 1000) * 1000000L };
        nanosleep(&ts, NULL);
    }
    return rc;
}

API int nvmlInit_v2(void)
{
    int rc = load();
    initialized = rc == OK;
    return rc;
}

API int nvmlInitWithFlags(unsigned flags)
{
    (void)flags;
    return nvmlInit_v2();
}

API int nvmlShutdown(void)
{
    if (!initialized)
        return UNINITIALIZED;
    initialized = 0;
    return OK;
}

API const char *nvmlErrorString(int rc)
{
    switch (rc) {
    case OK: return "Success";
    case UNINITIALIZED: return "Uninitialized";
    case INVALID_ARGUMENT: return "Invalid Argument";
    case NOT_SUPPORTED: return "Not Supported";
    case NOT_FOUND: return "Not Found";
    case INSUFFICIENT_SIZE: return "Insufficient Size";
    case DRIVER_NOT_LOADED: return "Driver Not Loaded";
    default: return "Unknown Error";
    }
}

/* A handle this library gave out, or NULL. */
static struct device *device(void *handle)
{
    struct device *d = handle;
    if (!initialized || !d)
        return NULL;
    if (d >= gpus && d < gpus + gpu_count)
        return d;
    if (d >= migs && d < migs + mig_count)
        return d;
    return NULL;
}

API int nvmlDeviceGetCount_v2(unsigned *count)
{
    if (!initialized)
        return UNINITIALIZED;
    if (!count)
        return INVALID_ARGUMENT;
    *count = gpu_count;
    return OK;
}

API int nvmlDeviceGetHandleByIndex_v2(unsigned index, void **handle)
{
    if (!initialized)
        return UNINITIALIZED;
    if (index >= gpu_count || !handle)
        return INVALID_ARGUMENT;
    *handle = &gpus[index];
    return OK;
}

API int nvmlDeviceGetUUID(void *handle, char *uuid, unsigned length)
{
    struct device *d = device(handle);
    if (!d || !uuid)
        return INVALID_ARGUMENT;
    if (strlen(d->uuid) + 1 > length)
        return INSUFFICIENT_SIZE;
    memcpy(uuid, d->uuid, strlen(d->uuid) + 1);
    return OK;
}

API int nvmlDeviceGetMinorNumber(void *handle, unsigned *minor)
{
    struct device *d = device(handle);
    if (!d || d->is_mig || !minor)
        return d && d->is_mig ? NOT_SUPPORTED : INVALID_ARGUMENT;
    *minor = d->minor;
    return OK;
}

API int nvmlDeviceGetMigMode(void *handle, unsigned *current, unsigned *pending)
{
    struct device *d = device(handle);
    if (!d || d->is_mig || !current || !pending)
        return INVALID_ARGUMENT;
    if (!d->mig_supported)
        return NOT_SUPPORTED;
    *current = d->mig_current; /* NVML_DEVICE_MIG_ENABLE = 1, DISABLE = 0 */
    *pending = d->mig_pending;
    return OK;
}

API int nvmlDeviceGetMaxMigDeviceCount(void *handle, unsigned *count)
{
    struct device *d = device(handle);
    if (!d || d->is_mig || !count)
        return INVALID_ARGUMENT;
    if (!d->mig_supported)
        return NOT_SUPPORTED;
    *count = d->max_mig;
    return OK;
}

API int nvmlDeviceGetMigDeviceHandleByIndex(void *handle, unsigned index, void **mig)
{
    struct device *d = device(handle);
    if (!d || d->is_mig || !mig || index >= d->max_mig)
        return INVALID_ARGUMENT;
    if (!d->mig[index])
        return NOT_FOUND;
    *mig = d->mig[index];
    return OK;
}

API int nvmlDeviceGetGpuInstanceId(void *handle, unsigned *id)
{
    struct device *d = device(handle);
    if (!d || !d->is_mig || !id)
        return INVALID_ARGUMENT;
    *id = d->gi;
    return OK;
}

API int nvmlDeviceGetComputeInstanceId(void *handle, unsigned *id)
{
    struct device *d = device(handle);
    if (!d || !d->is_mig || !id)
        return INVALID_ARGUMENT;
    *id = d->ci;
    return OK;
}
