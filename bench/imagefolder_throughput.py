"""The torchvision side of bench/imagefolder_throughput: ImageFolder + DataLoader with PIL and the
eval transforms (Resize(R), CenterCrop(S), ToTensor, Normalize), driven over a pipe (see
bench/torch_child.hpp): prints "ready ...", answers "step N" with the seconds one pass over the folder
took (N is ignored), ends on "quit".

  imagefolder_throughput.py ROOT WORKERS BATCH SIZE RESIZE
"""
import sys
import time

import torch
import torchvision.transforms as T
from torch.utils.data import DataLoader
from torchvision.datasets import ImageFolder

root, workers, batch, size, resize = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
torch.set_num_threads(1)
tf = T.Compose([T.Resize(resize), T.CenterCrop(size), T.ToTensor(),
                T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
ds = ImageFolder(root, transform=tf)
# persistent_workers: the worker processes start once, not once per pass.
loader = DataLoader(ds, batch_size=batch, shuffle=False, num_workers=workers, drop_last=True,
                    persistent_workers=workers > 0)
for _ in loader:  # warm-up pass: workers started, files in the page cache
    pass
print(f"ready torchvision {__import__('torchvision').__version__}, PIL {__import__('PIL').__version__}, "
      f"{len(ds)} images", flush=True)
for line in sys.stdin:
    cmd = line.strip()
    if cmd == "quit":
        break
    t0 = time.perf_counter()
    n = 0
    for x, y in loader:
        n += x.shape[0]
    print(f"{time.perf_counter() - t0:.6f}", flush=True)
