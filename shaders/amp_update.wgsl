// GradScaler.update on the device (torch's _amp_update_scale_, in float32): st = [scale, growth
// tracker]; after a step whose gradients had inf / NaN (found[0] != 0) the scale is multiplied by
// backoff and the tracker reset, else the tracker counts the clean step and at `interval` the scale
// grows (kept if finite) and the tracker restarts. One invocation. The host replays the same
// arithmetic once it has read the flag (wgpar/amp/grad_scaler.py), so its copy of the scale agrees.
// Bindings (st, found) and Params are declared with the kernel in Python.

@compute @workgroup_size(1)
fn main() {
  var scale = st[0];
  var tracker = st[1];
  if (found[0] != 0u) {
    scale = scale * p.backoff;
    tracker = 0.0;
  } else {
    tracker = tracker + 1.0;
    if (tracker == p.interval) {
      let grown = scale * p.growth;
      if (abs(grown) <= 3.40282347e38) { scale = grown; }  // finite (NaN fails too)
      tracker = 0.0;
    }
  }
  st[0] = scale;
  st[1] = tracker;
}
