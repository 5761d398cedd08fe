// A syntax error: the argument list never closes.
func.func @f(%a: !coco.tensor<8xf32> {
  func.return
}
