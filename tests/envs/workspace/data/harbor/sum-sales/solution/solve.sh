#!/bin/bash
cd /app
awk -F, 'NR > 1 { s += $2 } END { print s }' data/sales.csv > /app/total.txt
