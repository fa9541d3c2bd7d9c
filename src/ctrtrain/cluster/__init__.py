"""Who am I: the cluster from SageMaker's environment, TF_CONFIG or flags; roles per mode."""
