// RUN: coco-opt %s --split-input-file --parsing-diagnostics | filecheck %s

// Malformed coco syntax: each chunk is refused by the parser with a message that points at
// the offending token.

func.func @bogus_layout(%a: !coco.tensor<8xf32, bogus>) {
  func.return
}

// CHECK: {{.*}}parse_errors.mlir:6:49
// CHECK-NEXT: func.func @bogus_layout(%a: !coco.tensor<8xf32, bogus>) {
// CHECK-NEXT: ^^^^^
// CHECK-NEXT: expected a layout: replicated, local, sliced<DIM> or sliced<DIM, level L>

// -----

func.func @dynamic_dim(%a: !coco.tensor<?x8xf32>) {
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK-NEXT: {{.*}}parse_errors.mlir:17:41
// CHECK-NEXT: func.func @dynamic_dim(%a: !coco.tensor<?x8xf32>) {
// CHECK-NEXT: ^
// CHECK-NEXT: coco tensors have static shapes: '?' is not allowed here

// -----

func.func @negative_sliced_dim(%a: !coco.tensor<8xf32, sliced<-1>>) {
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK-NEXT: {{.*}}parse_errors.mlir:29:63
// CHECK-NEXT: func.func @negative_sliced_dim(%a: !coco.tensor<8xf32, sliced<-1>>) {
// CHECK-NEXT: ^
// CHECK-NEXT: Expected integer literal

// -----

func.func @unclosed_layouts(%a: !coco.tensor<8xf32, [local, local>) {
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK-NEXT: {{.*}}parse_errors.mlir:41:66
// CHECK-NEXT: func.func @unclosed_layouts(%a: !coco.tensor<8xf32, [local, local>) {
// CHECK-NEXT: ^
// CHECK-NEXT: Expected ']'

// -----

func.func @negative_grid() attributes {coco.grid = #coco.grid<[-2]>} {
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK-NEXT: {{.*}}parse_errors.mlir:53:64
// CHECK-NEXT: func.func @negative_grid() attributes {coco.grid = #coco.grid<[-2]>} {
// CHECK-NEXT: ^
// CHECK-NEXT: Expected integer literal

// -----

func.func @constant_truncation() {
  %0 = coco.constant 1.5 : !coco.tensor<i32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK-NEXT: {{.*}}parse_errors.mlir:66:22
// CHECK-NEXT: %0 = coco.constant 1.5 : !coco.tensor<i32>
// CHECK-NEXT: ^
// CHECK-NEXT: coco.constant of element type i32 needs an integer literal, got 1.5

// -----

func.func @constant_not_a_tensor() {
  %0 = coco.constant 1.5 : f32
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK-NEXT: {{.*}}parse_errors.mlir:79:28
// CHECK-NEXT: %0 = coco.constant 1.5 : f32
// CHECK-NEXT: ^
// CHECK-NEXT: coco.constant needs a !coco.tensor type, got f32

// -----

func.func @cmp_predicate(%a: !coco.tensor<8xf32>) {
  %0 = coco.cmp lol %a, %a : !coco.tensor<8xf32>, !coco.tensor<8xf32> -> !coco.tensor<8xi1>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK-NEXT: {{.*}}parse_errors.mlir:92:17
// CHECK-NEXT: %0 = coco.cmp lol %a, %a : !coco.tensor<8xf32>, !coco.tensor<8xf32> -> !coco.tensor<8xi1>
// CHECK-NEXT: ^^^
// CHECK-NEXT: Expected `eq`, `ne`, `lt`, `le`, `gt`, or `ge`.

// -----

func.func @reduce_kind(%a: !coco.tensor<8xf32>) {
  %0 = coco.reduce avg %a : !coco.tensor<8xf32> -> !coco.tensor<f32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK-NEXT: {{.*}}parse_errors.mlir:105:20
// CHECK-NEXT: %0 = coco.reduce avg %a : !coco.tensor<8xf32> -> !coco.tensor<f32>
// CHECK-NEXT: ^^^
// CHECK-NEXT: Expected `sum`, `max`, `min`, or `norm`.

// -----

func.func @signature_arity(%a: !coco.tensor<8xi32>) {
  %0 = coco.cmp eq %a, %a : !coco.tensor<8xi32> -> !coco.tensor<8xi1>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK-NEXT: {{.*}}parse_errors.mlir:118:29
// CHECK-NEXT: %0 = coco.cmp eq %a, %a : !coco.tensor<8xi32> -> !coco.tensor<8xi1>
// CHECK-NEXT: ^
// CHECK-NEXT: expected 2 operand type(s) and 1 result type(s), got 1 and 1

// -----

func.func @dropout_seed(%a: !coco.tensor<8xf32>) {
  %0 = coco.dropout %a, 0.1 : !coco.tensor<8xf32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK-NEXT: {{.*}}parse_errors.mlir:131:29
// CHECK-NEXT: %0 = coco.dropout %a, 0.1 : !coco.tensor<8xf32>
// CHECK-NEXT: ^
// CHECK-NEXT: Expected 'seed'

// -----

func.func @dense_constant_ragged() {
  %0 = coco.constant dense<[[1.0, 2.0], [3.0]]> : !coco.tensor<2x2xf32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK-NEXT: {{.*}}parse_errors.mlir:144:28
// CHECK-NEXT: %0 = coco.constant dense<{{\[\[}}1.0, 2.0], [3.0]]> : !coco.tensor<2x2xf32>
// CHECK-NEXT: ^
// CHECK-NEXT: a dense literal's rows must all have the same shape

// -----

func.func @dense_constant_scalar() {
  %0 = coco.constant dense<1.0> : !coco.tensor<4xf32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK-NEXT: {{.*}}parse_errors.mlir:157:28
// CHECK-NEXT: %0 = coco.constant dense<1.0> : !coco.tensor<4xf32>
// CHECK-NEXT: ^
// CHECK-NEXT: a dense literal lists every element in brackets (one value for every element is a splat: `coco.constant 1.0 : T`)

// -----

func.func @dense_constant_truncation() {
  %0 = coco.constant dense<[1, 2.5]> : !coco.tensor<2xi32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK-NEXT: {{.*}}parse_errors.mlir:170:22
// CHECK-NEXT: %0 = coco.constant dense<[1, 2.5]> : !coco.tensor<2xi32>
// CHECK-NEXT: ^
// CHECK-NEXT: coco.constant of element type i32 needs an integer literal, got 2.5

// -----

func.func @bad_level(%a: !coco.tensor<8xf32, [sliced<0, lvl 1>, sliced<0>]>) {
  func.return
}

// CHECK: {{.*}}parse_errors.mlir:[[# @LINE - 4]]:57
// CHECK-NEXT: func.func @bad_level(%a: !coco.tensor<8xf32, [sliced<0, lvl 1>, sliced<0>]>) {
// CHECK-NEXT: ^^^
// CHECK-NEXT: Expected 'level'
