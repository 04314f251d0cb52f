"""The OpenStack simulator's parts (../openstack_sim.py starts it): state.py holds the simulated cloud,
server.py answers HTTP and routes each request to its service's module, auth.py checks tokens."""
