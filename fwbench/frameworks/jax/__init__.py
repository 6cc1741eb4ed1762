"""JAX: jitted pure functions over a parameter pytree (plain jax, no flax or equinox)."""
