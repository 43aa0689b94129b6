"""The tests mirror the package tree (``tests/engine/kev/`` tests ``engine/kev/``; tests/test_layout.py
enforces it). Every folder here is a package, this one included, so pytest imports each test module by its
full name (``tests.engine.kev.test_kev_queue``): two test files of the same name in two folders never
collide, and ``tests.helpers`` and the other support modules here import the same way from anywhere."""
