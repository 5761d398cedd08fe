// RUN: COCO_VERIFY

// The program-level rules (dialects/program_rules.py): what a coconet module may hold, one
// refusal per chunk, each naming its rule. Every chunk here was accepted (or crashed a tool
// downstream) before the rules existed. The CHECK-LABEL on each chunk's separator keeps an
// error from being matched in another chunk.

// module-ops: an op outside any function.
%0 = coco.constant 1.0 : !coco.tensor<f32>
func.func @f(%a: !coco.tensor<8xf32>) {
  func.return
}

// CHECK: [module-ops] coco.constant at module level, outside any function: a coconet module holds only func.func

// -----

func.func @f(%a: !coco.tensor<8xf32>) {
  func.return
}
"test.op"() : () -> ()

// CHECK-LABEL: // {{-----}}
// CHECK: [module-ops] test.op at module level, outside any function

// -----

// function-declaration: nothing to run.
func.func private @declared(%a: !coco.tensor<8xf32>)

// CHECK-LABEL: // {{-----}}
// CHECK: [function-declaration] @declared is a declaration without a body

// -----

// function-blocks: coco has no control flow.
func.func @two_blocks(%a: !coco.tensor<8xf32>) {
  func.return
^bb1:
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [function-blocks] @two_blocks has 2 blocks: a coconet function is one block of ops

// -----

// nested-function: in a function body, or in a region of one.
func.func @outer(%a: !coco.tensor<8xf32>) {
  func.func @inner() {
    func.return
  }
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [nested-function] func.func @inner is nested in @outer: functions live at module level

// -----

func.func @in_fused(%a: !coco.tensor<8xf32>) {
  comm.fused elementwise {
    func.func @inner() {
      func.return
    }
    comm.yield
  }
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [nested-function] func.func @inner is nested in @in_fused: functions live at module level

// -----

// foreign-op: an op of another (here: xDSL's test) dialect inside a coco function.
func.func @foreign(%a: !coco.tensor<8xf32>) {
  "test.op"() : () -> ()
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [foreign-op] test.op in @foreign is not a coco or comm op: a coconet function holds coco and comm ops and ends in func.return

// -----

func.func @foreign_in_region(%a: !coco.tensor<8xf32>) -> !coco.tensor<8xf32> {
  %r = comm.fused elementwise -> !coco.tensor<8xf32> {
    %c = arith.constant 1.0 : f32
    %n = coco.neg %a : !coco.tensor<8xf32>
    comm.yield %n : !coco.tensor<8xf32>
  }
  func.return %r : !coco.tensor<8xf32>
}

// CHECK-LABEL: // {{-----}}
// CHECK: [foreign-op] arith.constant in @foreign_in_region is not a coco or comm op

// -----

// unknown-attribute: a misspelt grid would silently give the default 1-D grid.
func.func @misspelt(%a: !coco.tensor<8xf32>) attributes {coco.gird = #coco.grid<[2]>} {
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [unknown-attribute] @misspelt has attribute 'coco.gird', which coconet does not know (did you mean 'coco.grid'?)

// -----

func.func @op_attribute(%a: !coco.tensor<8xf32>) {
  %0 = coco.neg %a {coco.bogus = 1 : i64} : !coco.tensor<8xf32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [unknown-attribute] coco.neg in @op_attribute has attribute 'coco.bogus', which coconet does not know

// -----

func.func @comm_namespace(%a: !coco.tensor<8xf32>) {
  %0 = comm.all_reduce sum %a {comm.grid = #coco.grid<[2]>} : !coco.tensor<8xf32> -> !coco.tensor<8xf32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [unknown-attribute] comm.all_reduce in @comm_namespace has attribute 'comm.grid', which coconet does not know

// -----

func.func @grid_on_an_op(%a: !coco.tensor<8xf32>) {
  %1 = coco.neg %a {coco.grid = #coco.grid<[2]>} : !coco.tensor<8xf32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [unknown-attribute] coco.neg in @grid_on_an_op has attribute 'coco.grid', which coconet does not know: 'coco.grid' belongs on a func.func

// -----

func.func @argument_attribute(%a: !coco.tensor<8xf32> {coco.layout = 1 : i64}) {
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [unknown-attribute] argument #0 of @argument_attribute has attribute 'coco.layout', which coconet does not know (known: 'coco.symmetric')

// -----

// symmetric-argument: a unit attribute, on a tensor.
func.func @symmetric_with_a_value(%a: !coco.tensor<8xf32> {coco.symmetric = 1 : i64}) {
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [symmetric-argument] argument #0 of @symmetric_with_a_value has 'coco.symmetric' = 1 : i64: it is a unit attribute (write {coco.symmetric})

// -----

func.func @symmetric_scalar(%a: !coco.tensor<8xf32>, %s: !coco.tensor<f32> {coco.symmetric}) {
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [symmetric-argument] argument #1 of @symmetric_scalar is a scalar: 'coco.symmetric' places a tensor in symmetric memory

// -----

func.func @symmetric_misspelt(%a: !coco.tensor<8xf32> {coco.symetric}) {
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [unknown-attribute] argument #0 of @symmetric_misspelt has attribute 'coco.symetric', which coconet does not know (did you mean 'coco.symmetric'?)

// -----

// Attributes outside coconet's namespaces are not coconet's business.
func.func @foreign_attributes(%a: !coco.tensor<8xf32>) attributes {llvm.emit_c_interface} {
  %0 = coco.neg %a {note = "kept"} : !coco.tensor<8xf32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: func.func @foreign_attributes(%a: !coco.tensor<8xf32>) attributes {llvm.emit_c_interface}
// CHECK: coco.neg %a {note = "kept"}

// -----

// dominance: a use before its definition.
func.func @use_before_def(%a: !coco.tensor<8xf32>) {
  %1 = coco.neg %0 : !coco.tensor<8xf32>
  %0 = coco.neg %a : !coco.tensor<8xf32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [dominance] coco.neg in @use_before_def uses a result of coco.neg before its definition: a value is used only after the op defining it

// -----

func.func @own_result(%a: !coco.tensor<8xf32>) {
  %0 = coco.add %a, %0 : !coco.tensor<8xf32>
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [dominance] coco.add in @own_result uses its own result

// -----

func.func @region_reads_its_result(%a: !coco.tensor<8xf32>) {
  %r = comm.fused elementwise -> !coco.tensor<8xf32> {
    %s = coco.neg %r : !coco.tensor<8xf32>
    comm.yield %s : !coco.tensor<8xf32>
  }
  func.return
}

// CHECK-LABEL: // {{-----}}
// CHECK: [dominance] coco.neg in @region_reads_its_result uses %r, a result of the comm.fused it is nested in

// -----

// A region reads the values defined before it (it runs in place).
func.func @region_reads_outer_values(%a: !coco.tensor<8xf32>) -> !coco.tensor<8xf32> {
  %n = coco.neg %a : !coco.tensor<8xf32>
  %r = comm.fused elementwise -> !coco.tensor<8xf32> {
    %s = coco.add %n, %a : !coco.tensor<8xf32>
    comm.yield %s : !coco.tensor<8xf32>
  }
  func.return %r : !coco.tensor<8xf32>
}

// CHECK-LABEL: // {{-----}}
// CHECK: func.func @region_reads_outer_values
// CHECK-NOT: error
