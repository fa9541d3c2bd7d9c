import os
import time

if os.environ["SM_CURRENT_HOST"] == "algo-2":
    raise ValueError("the learning rate must be positive, got -1")
if "HOROVOD_RANK" in os.environ:
    # an MPI job's other rank, waiting on the failed one as in a collective: the job must end
    # when that rank fails, not when its time limit or watchdog does
    time.sleep(600)
