#!/bin/bash
# the input data is left as it was
grep -q '^east,18$' /app/data/sales.csv && test -f /app/README.txt
