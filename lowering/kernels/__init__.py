"""The kernels of a plan, built as kernel IR (lowering/kernel_ir.py) against the device layer
(toolchain/coco_device.h); lowering/cuda_printer.py prints them. One concern a module:

* elements.py: element types in C (storage, compute type, rounding, literals, arithmetic);
* statements.py: small statement and expression builders every kernel uses;
* spec.py: what an elementwise kernel computes, and the index maps of its operands;
* builder_state.py: the state of building one elementwise kernel (its parameters and body);
* params.py, body.py: the builder's parameters and coordinates, then its element body
  (loads, ops in program order, stores and pushes);
* vectors.py, pull.py, fused_reductions.py: a fused collective kernel's vector loop, its
  all_gather's pull, and its full reductions;
* elementwise.py: `ElementwiseKernel` and `ElementwiseBuilder`, the public base of the other
  region kernels' builders (row_collective.py);
* reductions.py: standalone full and row reductions; table.py: the table form of a kernel;
  node.py: the intra-node kernels of a hierarchical fused collective.

Every kernel is rank-independent: what depends on the rank count or the rank (local shapes,
the offset of a rank's slice, its dropout stream) arrives as kernel arguments, so one
translation unit serves every launch configuration and the kernel cache hits across runs.
"""
