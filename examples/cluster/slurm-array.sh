#!/usr/bin/env bash
# A lab grid on a Slurm cluster: one array task per shard, then one job
# that merges them when every task has ended.
#
#   sbatch --array=0-15 examples/cluster/slurm-array.sh examples/lab/small.toml
#   # then, once the array is done (or chained with --dependency=afterok:JOBID):
#   sbatch --dependency=afterok:JOBID --wrap \
#       'iocache lab merge results/small.*.jsonl -o results/small.jsonl --csv results/small.csv'
#
# Each task runs the points whose index modulo the array's task count is its
# own (`--shard auto` reads SLURM_ARRAY_TASK_ID, _MIN, _STEP and _COUNT),
# writes results/NAME.TASK.jsonl (with its side files), and resumes where a
# previous attempt of the same task stopped: requeued tasks redo nothing.
#SBATCH --job-name=iocache-lab
#SBATCH --cpus-per-task=2
#SBATCH --mem=4G
#SBATCH --output=results/slurm-%A_%a.log
set -euo pipefail

experiment=${1:?usage: sbatch --array=0-N slurm-array.sh EXPERIMENT.toml}
name=$(basename "$experiment" .toml)
mkdir -p results
exec iocache lab run "$experiment" --shard auto \
    --threads "${SLURM_CPUS_PER_TASK:-1}" \
    --out "results/$name.${SLURM_ARRAY_TASK_ID}.jsonl"
