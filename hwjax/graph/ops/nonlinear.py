"""Op kinds for nonlinear operators (softmax)."""
