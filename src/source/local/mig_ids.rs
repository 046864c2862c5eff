//! A MIG device's GPU and compute instance ids: NVML's `nvmlDeviceGetGpuInstanceId` and
//! `nvmlDeviceGetComputeInstanceId`, which nvml-wrapper loads but does not wrap. Two integers out of a
//! handle nvml-wrapper holds; the one `unsafe` block of this file.

use nvml_wrapper::{Device, Nvml};

/// (GPU instance id, compute instance id) of a MIG device handle; `None` where NVML does not say.
pub fn instance_ids(nvml: &Nvml, dev: &Device) -> (Option<u32>, Option<u32>) {
    let lib = nvml.lib();
    let (Ok(gi), Ok(ci)) = (
        lib.nvmlDeviceGetGpuInstanceId.as_ref(),
        lib.nvmlDeviceGetComputeInstanceId.as_ref(),
    ) else {
        return (None, None);
    };
    let (mut g, mut c) = (0u32, 0u32);
    // SAFETY: both are NVML's own entry points, loaded with the library this handle came from; each takes
    // the handle and writes one unsigned int through a pointer to a local that outlives the call.
    #[allow(unsafe_code)]
    let (rg, rc) = unsafe {
        let h = dev.handle();
        (gi(h, &raw mut g), ci(h, &raw mut c))
    };
    ((rg == 0).then_some(g), (rc == 0).then_some(c))
}
