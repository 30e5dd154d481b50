#!/usr/bin/env bash
# Gradescope runs this once, when it builds the autograder's image: the course and its test
# dependencies, with torch's CPU build (the graders run on CPU).
set -eu
apt-get install -y python3-pip python3-venv > /dev/null
cd /autograder/source
python3 -m pip install --upgrade pip
python3 -m pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
python3 -m pip install -e ".[dev]"
