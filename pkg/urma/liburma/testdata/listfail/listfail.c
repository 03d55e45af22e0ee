/* The fake liburma whose urma_get_device_list fails with errno LIST_ERRNO,
 * as liburma's does when its calloc fails or sysfs changes under the scan
 * (ENODEV: no device, which is no error). Built by TestDevicesListFails. */
#define urma_get_device_list fakeurma_real_get_device_list
#include "../fakeurma/fakeurma.c"
#undef urma_get_device_list

#ifndef LIST_ERRNO
#error "build with -DLIST_ERRNO=<errno>"
#endif

urma_device_t **urma_get_device_list(int *num_devices);

urma_device_t **urma_get_device_list(int *num_devices)
{
    *num_devices = 0;
    errno = LIST_ERRNO;
    return NULL;
}
