func.func @f(%a: !coco.tensor<8xf32>) {
  %0 = coco.bogus %a : !coco.tensor<8xf32>
  func.return
}
