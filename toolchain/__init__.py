"""The compilers of the device layer and the on-disk caches, below the lowering and the
runtime: `coco_device.h` (the device layer the generated text is written against), NVRTC for
GPUs (`nvrtc.py`), the host C++ compiler for CPUs (`host_compiler.py`) and the
content-addressed cache their builds share (`kernel_cache.py`). They know nothing of the IR or
the plan, so the runtime compiles a plan's text without reaching into the lowering."""
