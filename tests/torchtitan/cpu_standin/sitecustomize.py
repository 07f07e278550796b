"""A stand-in for the GPU TorchTitan 0.2.2 insists on, so its trainer runs unchanged on
CPU with gloo in the lab test (tests/test_torchtitan_config.py puts this directory on the
job's PYTHONPATH; nothing else imports it).

TorchTitan takes its device from torch._utils._get_available_device_type() or "cuda"
(torchtitan/tools/utils.py: get_device_info), so on a CPU-only build it calls
torch.cuda.set_device and fails. Here the device type is "cpu" (gloo is its default
backend), torch.cpu gets the few calls TorchTitan's DeviceMemoryMonitor and barrier make
(a device name, properties with total_memory, an integer current device, empty memory
statistics), and FSDP2 reduces gradients with SUM and its own division: TorchTitan sets a
gradient divide factor (llama3/infra/parallelize.py), which FSDP2 turns into NCCL's
PREMUL_SUM, an operation gloo lacks. Numerics and every layout decision stay TorchTitan's.
"""

import types

import torch
import torch._utils
import torch.cpu
from torch.distributed.fsdp import FSDPModule

torch._utils._get_available_device_type = lambda: "cpu"
torch.cpu.get_device_name = lambda device=None: "cpu"
torch.cpu.get_device_properties = lambda device=None: types.SimpleNamespace(name="cpu", total_memory=2**34)
torch.cpu.current_device = lambda: 0
torch.cpu.reset_peak_memory_stats = lambda device=None: None
torch.cpu.empty_cache = lambda: None
torch.cpu.memory_stats = lambda device=None: {}

_set_divide_factor = FSDPModule.set_gradient_divide_factor


def _sum_then_divide(self, factor):
    _set_divide_factor(self, factor)
    self.set_force_sum_reduction_for_comms(True)


FSDPModule.set_gradient_divide_factor = _sum_then_divide
