func.func @f(%a: i32) {
  %0 = coco.cast %a : i32 -> f32
  func.return
}
