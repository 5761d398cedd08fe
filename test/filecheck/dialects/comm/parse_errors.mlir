// RUN: coco-opt %s --split-input-file --parsing-diagnostics | filecheck %s

// Malformed comm syntax: each chunk is refused by the parser with a message that points at
// the offending token.

func.func @collective_kind(%a: !coco.tensor<8xf32, local>) {
  %0 = comm.all_reduce avg %a : !coco.tensor<8xf32, local> -> !coco.tensor<8xf32>
  func.return
}

// CHECK: {{.*}}parse_errors.mlir:7:24
// CHECK-NEXT: %0 = comm.all_reduce avg %a : !coco.tensor<8xf32, local> -> !coco.tensor<8xf32>
// CHECK-NEXT: ^^^
// CHECK-NEXT: Expected `sum`, `prod`, `max`, or `min`.

// -----

func.func @broadcast_root(%a: !coco.tensor<8xf32, local>) {
  %0 = comm.broadcast %a : !coco.tensor<8xf32, local> -> !coco.tensor<8xf32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK-NEXT: {{.*}}parse_errors.mlir:19:26
// CHECK-NEXT: %0 = comm.broadcast %a : !coco.tensor<8xf32, local> -> !coco.tensor<8xf32>
// CHECK-NEXT: ^
// CHECK-NEXT: Expected 'root'

// -----

func.func @send_shift(%a: !coco.tensor<8xf32, local>) {
  %0 = comm.send %a along 0 : !coco.tensor<8xf32, local>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK-NEXT: {{.*}}parse_errors.mlir:32:29
// CHECK-NEXT: %0 = comm.send %a along 0 : !coco.tensor<8xf32, local>
// CHECK-NEXT: ^
// CHECK-NEXT: Expected 'shift'

// -----

func.func @yield_arity(%a: !coco.tensor<8xf32>) {
  %0 = comm.fused elementwise -> !coco.tensor<8xf32> {
    comm.yield %a, %a : !coco.tensor<8xf32>
  }
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK-NEXT: {{.*}}parse_errors.mlir:47:3
// CHECK-NEXT: }
// CHECK-NEXT: ^
// CHECK-NEXT: expected 1 operand types but had 2

// -----

func.func @fusion_kind(%a: !coco.tensor<8xf32>) {
  comm.fused magic {
    comm.yield
  }
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK-NEXT: {{.*}}parse_errors.mlir:60:14
// CHECK-NEXT: comm.fused magic {
// CHECK-NEXT: ^^^^^
// CHECK-NEXT: Expected `elementwise`, `all_reduce`, `send`, `all_to_all`, `all_gather`, or `reduction`.

// -----

func.func @overlap_chunks(%a: !coco.tensor<8xf32>) {
  comm.overlap {
    comm.yield
  }
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK-NEXT: {{.*}}parse_errors.mlir:75:16
// CHECK-NEXT: comm.overlap {
// CHECK-NEXT: ^
// CHECK-NEXT: Expected 'chunks'

// -----

func.func @result_count(%a: !coco.tensor<8xf32>) {
  %0 = comm.overlap chunks 2 -> !coco.tensor<8xf32>, !coco.tensor<8xf32> {
    comm.yield %a, %a : !coco.tensor<8xf32>, !coco.tensor<8xf32>
  }
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK-NEXT: {{.*}}parse_errors.mlir:90:3
// CHECK-NEXT: %0 = comm.overlap chunks 2 -> !coco.tensor<8xf32>, !coco.tensor<8xf32> {
// CHECK-NEXT: ^^
// CHECK-NEXT: Operation has 2 results, but was given 1 to bind.
