"""What only the lessons need: nothing in the engine imports it.

    setup.py        quick mode, sizes per lesson and device, loading, fresh engines
    experiments/    measurements behind lessons 00-04
    scenarios/      measurements behind lessons 05-09
    figures.py      figures of lessons 00-04 (and the goodput figure 03 and 07 share)
    figures_capacity.py  lesson 03: batch x context, the KV-capacity bars
    widgets/        figures and ipywidgets dashboards of lessons 03 and 05-09
    trace_view.py   one engine step at a time: its trace and the KV bookkeeping around it
    predict.py      a learner's prediction beside the measurement
    table.py        Table: rows shown as text or HTML
    grade.py        `python -m nanoserve grade`: score the exercises
    demo.py         `python -m nanoserve demo`
"""
