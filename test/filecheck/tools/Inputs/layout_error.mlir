func.func @f(%a: !coco.tensor<8xf32, sliced<0>>) {
  %0 = comm.all_reduce sum %a : !coco.tensor<8xf32, sliced<0>> -> !coco.tensor<8xf32>
  func.return
}
