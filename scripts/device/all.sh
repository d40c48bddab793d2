#!/usr/bin/env bash
# Both pipelines, one after the other (the SoC first: it is the main result). AlexNet is left
# out of the SoC run (its GPU is 25x slower: every plan falls back to the CPU, as measured
# before PoCL's dense rule); the H100 run takes the models whose plans changed since they were last timed.
SOC_MODELS=${SOC_MODELS:-vgg19,vgg16,yolov2,fst,retinaface,posenet,inception_v1,resnet50,squeezenet} \
  bash /tmp/code/soc.sh
# The H100 models whose plans the planner's switch costs moved back to the GPU.
H100_MODELS=${H100_MODELS:-inception_v1,squeezenet,posenet,retinaface} bash /tmp/code/h100.sh
