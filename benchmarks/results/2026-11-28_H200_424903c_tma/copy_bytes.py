"""A device-to-device copy of as many bytes as gpu_bench's copy entry for a 4096x4096 f32 row kernel (32 MB read,
32 MB written), launched 3 times (for ncu)."""
import torch
x = torch.randn(4096 * 4096 // 2, device="cuda")
y = torch.empty_like(x)
for _ in range(3):
    y.copy_(x)
torch.cuda.synchronize()
