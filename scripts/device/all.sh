#!/usr/bin/env bash
# Both pipelines, one after the other (the SoC first: it is the main result). The H100 run
# takes the models whose plans the SoC-first order leaves time for (its GPU dominates; the
# others fell back to the GPU build in earlier runs).
bash /tmp/code/soc.sh
H100_MODELS=${H100_MODELS:-inception_v1,squeezenet,posenet,retinaface,fst,bvlc_alexnet} \
  bash /tmp/code/h100.sh
