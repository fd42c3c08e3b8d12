#!/bin/bash
# Harbor convention: run from the working directory, write the reward to /logs/verifier/reward.txt
if [ "$(cat /app/total.txt 2>/dev/null)" = "60" ] && bash /tests/check_inputs.sh; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
