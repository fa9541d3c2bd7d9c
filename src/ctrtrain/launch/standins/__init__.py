"""Packages a simulated SageMaker host imports under SageMaker's own names where its image has
none that works (launch/framework.py puts this directory first on the host's PYTHONPATH).
Each is standalone: it runs in the image's Python, which has TensorFlow but not ctrtrain."""
