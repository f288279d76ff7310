"""Tests of the launcher (launch/)."""
