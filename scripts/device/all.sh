#!/usr/bin/env bash
# Both pipelines, one after the other (the SoC first: it is the main result).
bash /tmp/code/soc.sh
bash /tmp/code/h100.sh
