func.func @ok() {
  func.return
}
// -----
func.func @bad(%a: !coco.tensor<8xf32>) {
  %0 = coco.bogus %a : !coco.tensor<8xf32>
  func.return
}
