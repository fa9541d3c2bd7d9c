"""Built-in entry points a job spec can name (`entry_point: {recipe: deepfm}`)."""
