func.func @f(%a: !coco.tensor<8xf32>) {
  func.return
}
// café in Latin-1
