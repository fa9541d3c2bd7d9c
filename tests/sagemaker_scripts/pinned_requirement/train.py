"""A script whose requirements.txt pins a package the image already holds, at another version
(protobuf, which TensorFlow's image ships): the toolkit's pip replaces it in the host's layer."""
import json
import os

import google.protobuf

with open(os.path.join(os.environ["SM_MODEL_DIR"], "protobuf.json"), "w") as f:
    json.dump({"version": google.protobuf.__version__}, f)
