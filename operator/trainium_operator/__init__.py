"""trainium-operator: distributed PyTorch training on AWS Trainium, compiled, profiled."""
