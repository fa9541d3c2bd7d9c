"""Entry point for a SageMaker TensorFlow estimator: hands over to `ctrtrain run`, which reads
the container's SageMaker environment and plays this host's roles (docs/cluster.md)."""
import sys

from ctrtrain.cli import main

sys.exit(main(["run", *sys.argv[1:]]))
