"""PPO with a critic, GAE, rejection fine-tuning, value pretraining, DeepSpeed engines."""
