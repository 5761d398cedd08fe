func.func @f(%a: !coco.tensor<8xi8>) {
  func.return
}
