/* The Vulkan loader's view of a container: vkCreateInstance, then
 * vkEnumeratePhysicalDevices, through Debian's libvulkan.so.1 (dlopen'ed: no
 * Vulkan headers or development links are needed to build this). Prints one line
 * per call with its VkResult; with VK_LOADER_DEBUG=all the loader logs to stderr
 * which ICD manifests it found and which driver libraries it loaded.
 * Exit status: 0 instance made, 1 vkCreateInstance failed, 2 no loader. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>

typedef int32_t VkResult;
typedef void *VkInstance;
typedef void *VkPhysicalDevice;
typedef struct {
    int32_t sType; /* VK_STRUCTURE_TYPE_APPLICATION_INFO = 0 */
    const void *pNext;
    const char *pApplicationName;
    uint32_t applicationVersion;
    const char *pEngineName;
    uint32_t engineVersion;
    uint32_t apiVersion;
} VkApplicationInfo;
typedef struct {
    int32_t sType; /* VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO = 1 */
    const void *pNext;
    uint32_t flags;
    const VkApplicationInfo *pApplicationInfo;
    uint32_t enabledLayerCount;
    const char *const *ppEnabledLayerNames;
    uint32_t enabledExtensionCount;
    const char *const *ppEnabledExtensionNames;
} VkInstanceCreateInfo;
typedef void (*PFN_vkVoidFunction)(void);
typedef PFN_vkVoidFunction (*PFN_vkGetInstanceProcAddr)(VkInstance, const char *);
typedef VkResult (*PFN_vkCreateInstance)(const VkInstanceCreateInfo *, const void *, VkInstance *);
typedef VkResult (*PFN_vkEnumeratePhysicalDevices)(VkInstance, uint32_t *, VkPhysicalDevice *);

int main(void) {
    void *lib = dlopen("libvulkan.so.1", RTLD_NOW);
    if (lib == NULL) {
        printf("dlopen libvulkan.so.1: %s\n", dlerror());
        return 2;
    }
    PFN_vkGetInstanceProcAddr gipa = (PFN_vkGetInstanceProcAddr)dlsym(lib, "vkGetInstanceProcAddr");
    PFN_vkCreateInstance create = (PFN_vkCreateInstance)gipa(NULL, "vkCreateInstance");
    VkApplicationInfo app = {0, NULL, "nri-gpu-vkprobe", 1, "none", 1, (1u << 22) | (1u << 12)};
    VkInstanceCreateInfo info = {1, NULL, 0, &app, 0, NULL, 0, NULL};
    VkInstance instance = NULL;
    VkResult result = create(&info, NULL, &instance);
    printf("vkCreateInstance: %d\n", (int)result);
    fflush(stdout);
    if (result != 0)
        return 1;
    PFN_vkEnumeratePhysicalDevices enumerate =
        (PFN_vkEnumeratePhysicalDevices)gipa(instance, "vkEnumeratePhysicalDevices");
    uint32_t count = 0;
    result = enumerate(instance, &count, NULL);
    printf("vkEnumeratePhysicalDevices: %d, %u devices\n", (int)result, count);
    return 0;
}
