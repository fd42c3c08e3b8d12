#!/bin/bash
jq . /app/data.json > /app/pretty.json
