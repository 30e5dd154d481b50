"""The real scheduler on a simulated clock: what one machine cannot show.

    simulator.py  CostModel, SimExecutor, simulate(): one engine instance on a modelled device
    calibrate.py  fit a CostModel to a real run's trace on this device
    devices.py    datasheet GPUs, links and model shapes, each with its source
    disagg.py     several instances on one clock: colocated vs prefill/decode disaggregation
"""

from nanoserve.sim.calibrate import Calibration, calibrate
from nanoserve.sim.devices import DEVICES, LINKS, DeviceProfile, Link, measured_profile, model_shape
from nanoserve.sim.disagg import goodput_sweep, simulate_colocated, simulate_disaggregated
from nanoserve.sim.simulator import CostModel, SimClock, SimExecutor, SimResult, sim_engine, simulate

__all__ = ["DEVICES", "LINKS", "Calibration", "CostModel", "DeviceProfile", "Link", "SimClock",
           "SimExecutor", "SimResult", "calibrate", "goodput_sweep", "measured_profile",
           "model_shape", "sim_engine", "simulate", "simulate_colocated", "simulate_disaggregated"]
