"""A script whose requirements.txt names a package from PyPI that the image lacks, as the
heterogeneous-cluster example's names tensorflow-addons: the toolkit installs it before this
runs."""
import json
import os

import tabulate

with open(os.path.join(os.environ["SM_MODEL_DIR"], "requirements.json"), "w") as f:
    json.dump({"version": tabulate.__version__, "module": tabulate.__file__,
               "table": tabulate.tabulate([[1, 2]], headers=["a", "b"], tablefmt="plain")}, f)
