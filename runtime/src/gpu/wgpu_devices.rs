//! wgpu adapters and logical devices on them.
//!
//! Each physical adapter gets one wgpu device (and queue); each logical
//! device on it gets its own CubeCL server (its own memory pool and
//! command stream) through `init_device` on a clone of that setup. So N
//! logical devices fit on any adapter - all eight of a test mesh on one
//! lavapipe software adapter - while keeping their memory separate.

use super::CubeclBackend;
use crate::error::RuntimeError;
use cubecl::prelude::*;
use cubecl::wgpu::{init_device, RuntimeOptions, WgpuRuntime, WgpuSetup};

/// The wgpu instance and the adapters it sees (Vulkan, Metal, DX12).
pub fn adapters() -> (wgpu::Instance, Vec<wgpu::Adapter>) {
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
        backends: wgpu::Backends::PRIMARY,
        ..wgpu::InstanceDescriptor::new_without_display_handle()
    });
    let adapters = cubecl::future::block_on(instance.enumerate_adapters(wgpu::Backends::PRIMARY));
    (instance, adapters)
}

/// A one-line description of an adapter, and whether it is a software
/// (CPU) implementation.
pub fn describe(a: &wgpu::Adapter) -> (String, bool) {
    let info = a.get_info();
    let kind = match info.device_type {
        wgpu::DeviceType::DiscreteGpu => "discrete GPU",
        wgpu::DeviceType::IntegratedGpu => "integrated GPU",
        wgpu::DeviceType::VirtualGpu => "virtual GPU",
        wgpu::DeviceType::Cpu => "software on the CPU",
        wgpu::DeviceType::Other => "other",
    };
    let software = info.device_type == wgpu::DeviceType::Cpu;
    (format!("{} ({kind}, {:?}, {} {})", info.name, info.backend, info.driver, info.driver_info), software)
}

/// Opens `count` logical devices on `adapter`, labelled with their logical
/// indices `first..first + count`.
pub fn open(
    instance: &wgpu::Instance,
    adapter: &wgpu::Adapter,
    count: usize,
    first: usize,
) -> Result<Vec<CubeclBackend<WgpuRuntime>>, RuntimeError> {
    let info = adapter.get_info();
    let (device, queue) = cubecl::future::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        label: Some("weft"),
        required_features: adapter.features().difference(wgpu::Features::MAPPABLE_PRIMARY_BUFFERS),
        required_limits: adapter.limits(),
        memory_hints: wgpu::MemoryHints::MemoryUsage,
        ..Default::default()
    }))
    .map_err(|e| RuntimeError::BackendUnavailable {
        backend: "wgpu".into(),
        reason: format!("cannot open a device on {}: {e}", info.name),
    })?;
    let setup =
        WgpuSetup { instance: instance.clone(), adapter: adapter.clone(), device, queue, backend: info.backend };
    Ok((first..first + count)
        .map(|i| {
            let dev = init_device(setup.clone(), RuntimeOptions::default());
            let client = WgpuRuntime::client(&dev);
            CubeclBackend::new(client, format!("wgpu device {i} on {}", info.name))
        })
        .collect())
}
