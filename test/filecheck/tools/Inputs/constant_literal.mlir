func.func @f() {
  %0 = coco.constant 1.5 : !coco.tensor<i32>
  func.return
}
