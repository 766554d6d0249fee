"""TorchServe model archives served by the platform: the archive, its handler in processes of its own, batching."""
