"""Model definitions. One definition per model family, run by both the trainer and the generator."""
