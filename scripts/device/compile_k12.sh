#!/usr/bin/env bash
# Here, not on the device: compile the k = 12 profiling campaigns for soc_k.sh (resumable).
set -e
cd "$(dirname "$0")/../.."
. .venv/bin/activate
M=vgg16,vgg19,yolov2,fst,retinaface,resnet50,inception_v1,posenet,squeezenet
# k = 12: the CPU runs 4 threads (recorded in the dispatch features)
python scripts/profile_campaign.py --preset emulated-soc --threads 4 --models $M --model-ratios 0.2,0.4,0.6,0.8 --algorithms winograd,packed --out .device/prof_k12_algos
echo ALGOS_DONE
python scripts/profile_campaign.py --preset emulated-soc --threads 4 --models $M --model-ratios 0.2,0.4,0.6,0.8 --out .device/prof_k12
echo MODELS_DONE
python scripts/profile_campaign.py --preset emulated-soc --threads 4 --codl 120 --pow2 60 --sample-ratios 0.3,0.7 --models $M --model-ratios 0.2,0.4,0.6,0.8 --out .device/prof_k12
echo ALL_DONE
