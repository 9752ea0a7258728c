"""Small helpers every stage may use; they import nothing else of dpstudy."""
