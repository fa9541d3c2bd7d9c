"""As the heterogeneous-cluster examples' launchers are written: the job read through the
SageMaker training toolkit's Environment, servers on fixed ports of named hosts, and a
package from requirements.txt."""
import json
import os
import socket
import time

from sagemaker_training import environment

import localpkg   # installed from requirements.txt by the toolkit before this runs

env = environment.Environment()
me, hosts = env.current_host, env.hosts
PORT = 6000

# Every host serves on the same fixed port; each connects to every other by name.
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("0.0.0.0", PORT))
server.listen()
heard = {}
for peer in hosts:
    if peer == me:
        continue
    for _ in range(200):
        try:
            with socket.create_connection((peer, PORT), timeout=2) as c:
                c.sendall(me.encode())
            break
        except OSError:
            time.sleep(0.1)
while len(heard) < len(hosts) - 1:
    conn, addr = server.accept()
    heard[conn.recv(64).decode()] = addr[0]
    conn.close()
model_dir = os.environ["SM_MODEL_DIR"]
with open(os.path.join(model_dir, f"{me}.json"), "w") as f:
    json.dump({"host": me, "hosts": hosts, "heard": heard, "localpkg": localpkg.VALUE,
               "localpkg_file": localpkg.__file__, "master": env.master_hostname,
               "is_master": env.is_master, "channels": env.channel_input_dirs,
               "hps": env.hyperparameters, "module_name": env.module_name,
               "env": {k: v for k, v in os.environ.items() if k.startswith("SM_")}}, f)
