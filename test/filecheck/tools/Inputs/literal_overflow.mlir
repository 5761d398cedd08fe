func.func @f(%a: !coco.tensor<8xf32>) {
  %c = coco.neg %a {x = 340282366920938463463374607431768211456 : f32} : !coco.tensor<8xf32>
  func.return
}
